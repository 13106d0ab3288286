// model.c: the model.bin format: config limits, tensor layouts, the file plan, the header writer and the pure
// parser. No I/O: loader.c reads files, convert/ writes them.
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(dj_config) == 80, "dj_config is 80 bytes on disk");
_Static_assert(sizeof(dj_disk_header) == 128, "dj_disk_header is 128 bytes on disk");
_Static_assert(sizeof(dj_disk_section) == 32, "dj_disk_section is 32 bytes on disk");
_Static_assert(sizeof(dj_disk_tensor) == 40, "dj_disk_tensor is 40 bytes on disk");

#define FIX_HINT "re-run ./convert/convert to rewrite the file"
#define GGUF_MAGIC "GGUF"  // llama.cpp's model files start with these 4 bytes

// ---- dtypes
size_t dj_dtype_size(uint32_t dtype) {
    switch (dtype) {
    case DJ_F32: return 4;
    case DJ_F16: return 2;
    case DJ_BF16: return 2;
    default: return 0;
    }
}

const char *dj_dtype_name(uint32_t dtype) {
    switch (dtype) {
    case DJ_F32: return "f32";
    case DJ_F16: return "f16";
    case DJ_BF16: return "bf16";
    case DJ_Q8: return "q8";
    case DJ_Q4: return "q4";
    default: return "?";
    }
}

const char *dj_tensor_name(uint32_t kind) {
    static const char *names[DJ_N_TENSOR_KINDS] = {"attn_norm", "ffn_norm", "wq",    "wk",         "wv",     "wo",
                                                   "w_gate",    "w_up",     "w_down", "embeddings", "final_norm",
                                                   "lm_head"};
    return kind < DJ_N_TENSOR_KINDS ? names[kind] : "?";
}

// ---- config and layout
int dj_config_validate(const dj_config *c, dj_err *e) {
    // Limits are generous (Llama 3.1 405B: dim 16384, 126 layers, hidden 53248, vocab 128256) but keep
    // every product far from overflow.
    if (c->dim == 0 || c->dim > 65536) return dj_fail(e, "dim %u out of range (1..65536)", c->dim);
    if (c->n_layers == 0 || c->n_layers > DJ_MAX_LAYERS)
        return dj_fail(e, "n_layers %u out of range (1..%u)", c->n_layers, DJ_MAX_LAYERS);
    if (c->n_heads == 0 || c->n_heads > 1024) return dj_fail(e, "n_heads %u out of range (1..1024)", c->n_heads);
    if (c->n_kv_heads == 0 || c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads)
        return dj_fail(e, "n_kv_heads %u must divide n_heads %u", c->n_kv_heads, c->n_heads);
    if (c->head_dim == 0 || c->head_dim > 1024 || c->head_dim % 2)
        return dj_fail(e, "head_dim %u must be even and in 2..1024", c->head_dim);
    if (c->hidden_dim == 0 || c->hidden_dim > 1u << 20)
        return dj_fail(e, "hidden_dim %u out of range (1..%u)", c->hidden_dim, 1u << 20);
    if (c->vocab_size == 0 || c->vocab_size > 1u << 22)
        return dj_fail(e, "vocab_size %u out of range (1..%u)", c->vocab_size, 1u << 22);
    if (c->max_seq_len == 0 || c->max_seq_len > 1u << 24)
        return dj_fail(e, "max_seq_len %u out of range (1..%u)", c->max_seq_len, 1u << 24);
    if (!dj_row_bytes(c->wtype, 1)) return dj_fail(e, "unknown weight dtype %u", c->wtype);
    if (c->tied > 1) return dj_fail(e, "tied flag %u is not 0 or 1", c->tied);
    if (!(c->norm_eps > 0 && c->norm_eps < 1)) return dj_fail(e, "norm_eps %g out of range (0..1)", c->norm_eps);
    if (!(c->rope_theta > 0 && c->rope_theta < 1e12f))
        return dj_fail(e, "rope_theta %g out of range", c->rope_theta);
    if (c->rope_type == DJ_ROPE_LLAMA3) {
        if (!(c->rope_factor >= 1 && c->rope_factor < 1e6f)) return dj_fail(e, "llama3 rope factor %g out of range", c->rope_factor);
        if (!(c->rope_low_freq > 0 && c->rope_high_freq > c->rope_low_freq && c->rope_high_freq < 1e6f))
            return dj_fail(e, "llama3 rope needs 0 < low_freq_factor (%g) < high_freq_factor (%g)", c->rope_low_freq,
                           c->rope_high_freq);
        if (c->rope_orig_max == 0) return dj_fail(e, "llama3 rope needs original_max_position_embeddings > 0");
    } else if (c->rope_type != DJ_ROPE_DEFAULT) {
        return dj_fail(e, "unknown rope type %u", c->rope_type);
    } else if (c->rope_factor != 0 || c->rope_low_freq != 0 || c->rope_high_freq != 0 || c->rope_orig_max != 0) {
        // Fields a reader of this version ignores must be zero, so that a later version can give them meaning.
        return dj_fail(e, "llama3 rope fields are set but the rope type is default");
    }
    // The embeddings and the lm_head are in the layers' dtype, or in q8 beside quantized layers.
    for (int i = 0; i < 2; i++) {
        uint32_t t = i ? c->head_type : c->embed_type;
        if (t != c->wtype && !(t == DJ_Q8 && dj_is_quant(c->wtype)))
            return dj_fail(e, "%s in %s beside %s layers: this build reads them in the layers' dtype, or in q8 beside "
                              "quantized layers", i ? "lm_head" : "embeddings", dj_dtype_name(t), dj_dtype_name(c->wtype));
    }
    if (c->reserved) return dj_fail(e, "reserved config word is %u, not zero", c->reserved);
    return 0;
}

int dj_layout(const dj_config *c, dj_layer_layout *L, dj_head_layout *H, dj_err *e) {
    if (dj_config_validate(c, e)) return -1;
    // With the limits above every product below fits easily in 64 bits (< 2^60); no overflow checks needed.
    uint32_t wt = c->wtype;
    uint64_t dim = c->dim, q = (uint64_t)c->n_heads * c->head_dim, kv = (uint64_t)c->n_kv_heads * c->head_dim,
             hid = c->hidden_dim, a = DJ_TENSOR_ALIGN, off = 0;
#define PLACE(field, bytes) (L->field = off, off = dj_align_up(off + (bytes), a))
    PLACE(attn_norm, dim * 4);
    PLACE(ffn_norm, dim * 4);
    PLACE(wq, dj_matrix_bytes(wt, q, dim));
    PLACE(wk, dj_matrix_bytes(wt, kv, dim));
    PLACE(wv, dj_matrix_bytes(wt, kv, dim));
    PLACE(wo, dj_matrix_bytes(wt, dim, q));
    PLACE(w_gate, dj_matrix_bytes(wt, hid, dim));
    PLACE(w_up, dj_matrix_bytes(wt, hid, dim));
    PLACE(w_down, dj_matrix_bytes(wt, dim, hid));
#undef PLACE
    L->size = dj_align_up(off, DJ_SECTION_ALIGN);
    H->norm = 0;
    H->lm_head = dj_align_up(dim * 4, a);
    H->size = dj_align_up(c->tied ? dim * 4 : H->lm_head + dj_matrix_bytes(c->head_type, c->vocab_size, dim),
                          DJ_SECTION_ALIGN);
    return 0;
}

int dj_tensor_table(const dj_config *c, const dj_layer_layout *L, const dj_head_layout *H, dj_disk_tensor *t) {
    uint64_t dim = c->dim, q = (uint64_t)c->n_heads * c->head_dim, kv = (uint64_t)c->n_kv_heads * c->head_dim,
             hid = c->hidden_dim, vocab = c->vocab_size;
    int n = 0;
#define T(k, dt, r, cc, off) (t[n++] = (dj_disk_tensor){(k), (dt), (r), (cc), (off), dj_matrix_bytes((dt), (r), (cc))})
    T(DJ_T_ATTN_NORM, DJ_F32, dim, 1, L->attn_norm);
    T(DJ_T_FFN_NORM, DJ_F32, dim, 1, L->ffn_norm);
    T(DJ_T_WQ, c->wtype, q, dim, L->wq);
    T(DJ_T_WK, c->wtype, kv, dim, L->wk);
    T(DJ_T_WV, c->wtype, kv, dim, L->wv);
    T(DJ_T_WO, c->wtype, dim, q, L->wo);
    T(DJ_T_W_GATE, c->wtype, hid, dim, L->w_gate);
    T(DJ_T_W_UP, c->wtype, hid, dim, L->w_up);
    T(DJ_T_W_DOWN, c->wtype, dim, hid, L->w_down);
    T(DJ_T_EMBED, c->embed_type, vocab, dim, 0);
    T(DJ_T_FINAL_NORM, DJ_F32, dim, 1, H->norm);
    if (!c->tied) T(DJ_T_LM_HEAD, c->head_type, vocab, dim, H->lm_head);
#undef T
    return n;
}

// ---- file plan and header
// Header, section table and (version 2) tensor table, rounded up: where the first section may start.
static uint64_t header_bytes_of(uint32_t version, uint32_t n_layers) {
    return dj_align_up(DJ_HEADER_SIZE + (uint64_t)(n_layers + 3) * sizeof(dj_disk_section) +
                           (version >= 2 ? DJ_N_TENSOR_KINDS * sizeof(dj_disk_tensor) : 0),
                       DJ_SECTION_ALIGN);
}

uint64_t model_header_bytes(uint32_t n_layers) { return header_bytes_of(DJ_VERSION, n_layers); }

int model_plan(const dj_config *c, uint64_t tok_size, dj_model_info *m, dj_err *e) {
    memset(m, 0, sizeof *m);
    m->config = *c;
    if (dj_layout(c, &m->layer, &m->head, e)) return -1;
    if (tok_size == 0 || tok_size > (1ull << 32)) return dj_fail(e, "tokenizer section of %llu bytes out of range",
                                                                 (unsigned long long)tok_size);
    m->layer_off = malloc(c->n_layers * sizeof *m->layer_off);
    if (!m->layer_off) return dj_fail(e, "out of memory");
    m->version = DJ_VERSION;
    m->header_bytes = model_header_bytes(c->n_layers);
    uint64_t off = m->header_bytes;
    m->tok_off = off, m->tok_size = tok_size;
    off = dj_align_up(off + tok_size, DJ_SECTION_ALIGN);
    m->embed_off = off, m->embed_size = dj_matrix_bytes(c->embed_type, c->vocab_size, c->dim);
    off = dj_align_up(off + m->embed_size, DJ_SECTION_ALIGN);
    for (uint32_t l = 0; l < c->n_layers; l++) m->layer_off[l] = off, off += m->layer.size;
    m->head_off = off, m->head_size = m->head.size;
    m->file_size = off + m->head.size;
    return 0;
}

void dj_info_free(dj_model_info *m) {
    free(m->layer_off);
    m->layer_off = NULL;
}

// Header + table bytes covered by the CRC, in file order.
static uint32_t header_crc(const uint8_t *hdr, const uint8_t *table, size_t table_bytes) {
    uint8_t copy[sizeof(dj_disk_header)];
    memcpy(copy, hdr, sizeof copy);
    memset(copy + offsetof(dj_disk_header, crc), 0, 4);
    uint32_t crc = dj_crc32(0, copy, sizeof copy);
    crc = dj_crc32(crc, hdr + sizeof copy, DJ_HEADER_SIZE - sizeof copy);
    return dj_crc32(crc, table, table_bytes);
}

int model_write_header(const dj_model_info *m, void *buf, size_t n, dj_err *e) {
    uint32_t nl = m->config.n_layers, ns = nl + 3;
    if (n < model_header_bytes(nl)) return dj_fail(e, "header buffer too small");
    memset(buf, 0, n);
    dj_disk_header h = {0};
    memcpy(h.magic, DJ_MAGIC, 8);
    h.version = DJ_VERSION;
    h.header_size = DJ_HEADER_SIZE;
    h.file_size = m->file_size;
    h.n_sections = ns;
    h.config = m->config;
    dj_disk_section *t = (dj_disk_section *)((uint8_t *)buf + DJ_HEADER_SIZE);
    t[0] = (dj_disk_section){DJ_SEC_TOKENIZER, 0, m->tok_off, m->tok_size, 0};
    t[1] = (dj_disk_section){DJ_SEC_EMBED, 0, m->embed_off, m->embed_size, 0};
    for (uint32_t l = 0; l < nl; l++) t[2 + l] = (dj_disk_section){DJ_SEC_LAYER, l, m->layer_off[l], m->layer.size, 0};
    t[2 + nl] = (dj_disk_section){DJ_SEC_HEAD, 0, m->head_off, m->head_size, 0};
    dj_disk_tensor tt[DJ_N_TENSOR_KINDS];
    h.n_tensors = (uint32_t)dj_tensor_table(&m->config, &m->layer, &m->head, tt);
    memcpy(t + ns, tt, h.n_tensors * sizeof *tt);
    memcpy(buf, &h, sizeof h);
    h.crc = header_crc(buf, (const uint8_t *)t, ns * sizeof *t + h.n_tensors * sizeof *tt);
    memcpy(buf, &h, sizeof h);
    return 0;
}

// ---- parsing
static const char *section_name(uint32_t kind) {
    switch (kind) {
    case DJ_SEC_TOKENIZER: return "tokenizer";
    case DJ_SEC_EMBED: return "embedding";
    case DJ_SEC_LAYER: return "layer";
    case DJ_SEC_HEAD: return "head";
    default: return "unknown";
    }
}

typedef struct {
    uint64_t off, size;
    uint32_t kind, index;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

static void describe(char *out, size_t n, const dj_disk_tensor *t) {
    snprintf(out, n, "%llu x %llu %s at offset %llu (%llu bytes)", (unsigned long long)t->rows,
             (unsigned long long)t->cols, dj_dtype_name(t->dtype), (unsigned long long)t->offset,
             (unsigned long long)t->bytes);
}

// Version 2: every entry of the stored tensor table must be what the config implies, field for field.
static int check_tensor_table(const dj_model_info *m, const void *stored, uint32_t n, dj_err *e) {
    dj_disk_tensor want[DJ_N_TENSOR_KINDS], got;
    int k = dj_tensor_table(&m->config, &m->layer, &m->head, want);
    for (uint32_t i = 0; i < n && (int)i < k; i++) {
        memcpy(&got, (const uint8_t *)stored + i * sizeof got, sizeof got);
        if (!memcmp(&got, &want[i], sizeof got)) continue;
        char a[160], b[160];
        describe(a, sizeof a, &got), describe(b, sizeof b, &want[i]);
        if (got.kind != want[i].kind)
            return dj_fail(e, "tensor table entry %u is '%s', expected '%s': damaged file, " FIX_HINT, i,
                           dj_tensor_name(got.kind), dj_tensor_name(want[i].kind));
        return dj_fail(e, "tensor table: %s is %s, but the config implies %s: damaged file, " FIX_HINT,
                       dj_tensor_name(got.kind), a, b);
    }
    return 0;
}

int model_parse(const void *data, size_t n, uint64_t file_size, dj_model_info *m, dj_err *e) {
    memset(m, 0, sizeof *m);
    const uint8_t *p = data;
    // llama.cpp's files are the likeliest wrong input from a new user: say what the file is and what to do, before
    // any size check (a GGUF file of any length is still a GGUF file).
    if (n >= sizeof GGUF_MAGIC - 1 && !memcmp(p, GGUF_MAGIC, sizeof GGUF_MAGIC - 1))
        return dj_fail(e, "a GGUF file (llama.cpp's format), which Djinn does not read: convert the Hugging Face "
                          "checkpoint with ./convert/convert instead");
    if (file_size < DJ_HEADER_SIZE || n < DJ_HEADER_SIZE)
        return dj_fail(e, "not a Djinn model: %llu bytes is shorter than the %u-byte header",
                       (unsigned long long)file_size, DJ_HEADER_SIZE);
    dj_disk_header h;
    memcpy(&h, p, sizeof h);
    if (memcmp(h.magic, DJ_MAGIC, 8))
        return dj_fail(e, "not a Djinn model (bad magic): convert a HuggingFace checkpoint with ./convert/convert");
    if (h.version > DJ_VERSION)
        return dj_fail(e, "model.bin version %u is newer than this build reads (versions %u to %u): update djinn",
                       h.version, DJ_VERSION_MIN, DJ_VERSION);
    if (h.version < DJ_VERSION_MIN)
        return dj_fail(e, "model.bin version %u, this build reads versions %u to %u: " FIX_HINT, h.version,
                       DJ_VERSION_MIN, DJ_VERSION);
    if (h.header_size != DJ_HEADER_SIZE)
        return dj_fail(e, "header size %u, expected %u: " FIX_HINT, h.header_size, DJ_HEADER_SIZE);
    if (h.file_size != file_size)
        return dj_fail(e, "file is %llu bytes but its header says %llu: truncated or damaged, " FIX_HINT,
                       (unsigned long long)file_size, (unsigned long long)h.file_size);
    for (size_t i = offsetof(dj_disk_header, pad); i < DJ_HEADER_SIZE; i++)
        if (p[i]) return dj_fail(e, "header padding byte %zu is not zero: damaged file, " FIX_HINT, i);
    dj_config cfg = h.config;
    const dj_config *c = &cfg;
    if (h.version == 1) {  // one dtype for every matrix, no tensor table
        if (cfg.embed_type || cfg.head_type)
            return dj_fail(e, "bad config in header: reserved config words are not zero: damaged file, " FIX_HINT);
        if (h.n_tensors) return dj_fail(e, "a version 1 file with a tensor table: damaged file, " FIX_HINT);
        if (dj_is_quant(cfg.wtype))
            return dj_fail(e, "a version 1 file with %s weights (version 1 holds f32, f16 or bf16): damaged file, " FIX_HINT,
                           dj_dtype_name(cfg.wtype));
        cfg.embed_type = cfg.head_type = cfg.wtype;
    }
    if (h.version == 2 && dj_is_quant(cfg.wtype))
        return dj_fail(e, "a version 2 file with %s weights: that %s (symmetric, without zero points) is no longer "
                          "read; " FIX_HINT, dj_dtype_name(cfg.wtype), dj_dtype_name(cfg.wtype));
    dj_err ce;
    if (dj_config_validate(c, &ce)) return dj_fail(e, "bad config in header: %s", ce.msg);
    if (h.n_sections != c->n_layers + 3)
        return dj_fail(e, "%u sections for %u layers, expected %u: " FIX_HINT, h.n_sections, c->n_layers,
                       c->n_layers + 3);
    if (h.version >= 2 && h.n_tensors != DJ_N_TENSOR_KINDS - c->tied)
        return dj_fail(e, "%u entries in the tensor table, expected %u: " FIX_HINT, h.n_tensors,
                       DJ_N_TENSOR_KINDS - c->tied);
    uint64_t table_bytes = (uint64_t)h.n_sections * sizeof(dj_disk_section) + h.n_tensors * sizeof(dj_disk_tensor);
    if (DJ_HEADER_SIZE + table_bytes > file_size || DJ_HEADER_SIZE + table_bytes > n)
        return dj_fail(e, "section and tensor tables run past the end of the file: truncated, " FIX_HINT);

    m->version = h.version;
    m->header_bytes = header_bytes_of(h.version, c->n_layers);
    m->config = *c;
    m->file_size = file_size;
    if (dj_layout(c, &m->layer, &m->head, e)) return -1;
    m->layer_off = calloc(c->n_layers, sizeof *m->layer_off);
    span *spans = calloc(h.n_sections, sizeof *spans);
    uint8_t *seen = calloc(c->n_layers, 1);
    int have_tok = 0, have_embed = 0, have_head = 0, rc = -1;
    if (!m->layer_off || !spans || !seen) {
        dj_fail(e, "out of memory");
        goto out;
    }
    const uint8_t *tp = p + DJ_HEADER_SIZE;
    uint64_t embed_size = dj_matrix_bytes(c->embed_type, c->vocab_size, c->dim);
    for (uint32_t i = 0; i < h.n_sections; i++) {
        dj_disk_section s;
        memcpy(&s, tp + (size_t)i * sizeof s, sizeof s);
        uint64_t end;
        if (s.reserved) {
            dj_fail(e, "%s section %u: reserved field is %llu, not zero: damaged file, " FIX_HINT, section_name(s.kind),
                    s.index, (unsigned long long)s.reserved);
            goto out;
        }
        if (s.offset % DJ_SECTION_ALIGN || s.offset < DJ_HEADER_SIZE + table_bytes ||
            dj_add_u64(s.offset, s.size, &end) || end > file_size) {
            dj_fail(e, "%s section %u: offset %llu size %llu is outside the file (%llu bytes) or misaligned: " FIX_HINT,
                    section_name(s.kind), s.index, (unsigned long long)s.offset, (unsigned long long)s.size,
                    (unsigned long long)file_size);
            goto out;
        }
        uint64_t want = 0;
        switch (s.kind) {
        case DJ_SEC_TOKENIZER:
            if (have_tok++) break;
            m->tok_off = s.offset, m->tok_size = want = s.size;
            if (!s.size) {
                dj_fail(e, "tokenizer section is empty: " FIX_HINT);
                goto out;
            }
            break;
        case DJ_SEC_EMBED:
            if (have_embed++) break;
            m->embed_off = s.offset, m->embed_size = s.size, want = embed_size;
            break;
        case DJ_SEC_HEAD:
            if (have_head++) break;
            m->head_off = s.offset, m->head_size = s.size, want = m->head.size;
            break;
        case DJ_SEC_LAYER:
            if (s.index >= c->n_layers) {
                dj_fail(e, "layer section index %u, model has %u layers: " FIX_HINT, s.index, c->n_layers);
                goto out;
            }
            if (seen[s.index]++) break;
            m->layer_off[s.index] = s.offset, want = m->layer.size;
            break;
        default:
            dj_fail(e, "section %u has unknown kind %u: " FIX_HINT, i, s.kind);
            goto out;
        }
        if (s.kind != DJ_SEC_LAYER && s.index) {
            dj_fail(e, "%s section has index %u, expected 0: damaged file, " FIX_HINT, section_name(s.kind), s.index);
            goto out;
        }
        if ((s.kind == DJ_SEC_TOKENIZER && have_tok > 1) || (s.kind == DJ_SEC_EMBED && have_embed > 1) ||
            (s.kind == DJ_SEC_HEAD && have_head > 1) || (s.kind == DJ_SEC_LAYER && seen[s.index] > 1)) {
            dj_fail(e, "duplicate %s section %u: " FIX_HINT, section_name(s.kind), s.index);
            goto out;
        }
        if (s.size != want) {
            dj_fail(e, "%s section %u is %llu bytes, expected %llu for this config: " FIX_HINT, section_name(s.kind),
                    s.index, (unsigned long long)s.size, (unsigned long long)want);
            goto out;
        }
        spans[i] = (span){s.offset, s.size, s.kind, s.index};
    }
    // n_layers + 3 sections without duplicates means each kind is present exactly once.
    qsort(spans, h.n_sections, sizeof *spans, span_cmp);
    for (uint32_t i = 1; i < h.n_sections; i++)
        if (spans[i - 1].off + spans[i - 1].size > spans[i].off) {
            dj_fail(e, "%s section %u overlaps %s section %u: " FIX_HINT, section_name(spans[i - 1].kind),
                    spans[i - 1].index, section_name(spans[i].kind), spans[i].index);
            goto out;
        }
    if (check_tensor_table(m, (const dj_disk_tensor *)(tp + (size_t)h.n_sections * sizeof(dj_disk_section)),
                           h.n_tensors, e))
        goto out;
    // Structure checked; the CRC last, so that fuzzers exercise the checks above.
    if (header_crc(p, tp, table_bytes) != h.crc) {
        dj_fail(e, "header checksum mismatch: damaged file, " FIX_HINT);
        goto out;
    }
    rc = 0;
out:
    free(spans);
    free(seen);
    if (rc) dj_info_free(m);
    return rc;
}
