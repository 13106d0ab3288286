// session.h: a generation saved to a file and resumed later (--save-session, --load-session): its tokens, the KV
// cache of the positions computed and the sampler's state, so that the resumed run goes on exactly as the run would
// have (greedy: the same bytes; sampled: the same tokens for the same seed), on either engine.
//
// ---- the session file (little-endian), written atomically (fileio.h):
//   [0, 256)   header: char magic[8] "DJINNSES", u32 version (1), u32 header_size (256), u64 file_size,
//              u32 header_crc (CRC-32 of the header with this field zero), u32 data_crc (of the tokens and the KV
//              cache, as stored), the model: u64 its model.bin's size, u32 its fingerprint (model_fingerprint),
//              u32 n_layers, u32 dim, u32 n_kv_heads, u32 head_dim, u32 vocab;
//              at 64: u64 ctx (the context, -c), u64 n_tokens, u64 n_prompt (the first run's prompt), u64 n_kv (the
//              positions the KV cache holds: n_tokens, or n_tokens - 1 when the last token was not fed yet), i32 next
//              (the token already picked after position n_kv - 1, or -1), u32 kv_type (the KV cache's, kvtype.h: 0 f32,
//              1 f16, 2 q8; files written before there were types hold 0 here, f32, and read as they did),
//              u64 rng (the generator's state),
//              the sampling settings (f64 temp, top_p, min_p; i64 top_k; f64 repeat_penalty, presence_penalty,
//              frequency_penalty; i64 repeat_last_n), u64 tokens_off (256), u64 kv_off, u64 kv_bytes; zero padding
//   tokens     n_tokens i32
//   KV cache   engine.h's parked layout of n_kv positions in kv_type: keys, then values, each (n_layers,
//              n_kv_heads, n_kv, head_dim) elements of the type; q8: then the keys' and the values' scales, each
//              (n_layers, n_kv_heads, n_kv) f32. Either engine reads it bitwise (kvtype.h's rounding is both's).
#ifndef DJINN_SESSION_H
#define DJINN_SESSION_H

#include <stdint.h>

#include "engine.h"
#include "fileio.h"
#include "loader.h"
#include "sampler.h"

#define SESSION_MAGIC "DJINNSES"
#define SESSION_VERSION 1u
#define SESSION_HEADER 256u

typedef struct {
    int32_t *ids;         // (n_tokens)
    int64_t n_tokens, n_prompt, n_kv, ctx;
    int32_t next;         // picked after position n_kv - 1 (then n_kv == n_tokens), or -1
    int kv_type;          // session_open's: the file's KV cache type (kvtype.h); session_save takes the engine's
    uint64_t rng;         // sampler_rng_state
    dj_sampling smp;      // the settings it was sampled with
    // session_open's file, for session_resume
    int fd;
    const char *path;
    uint64_t kv_off, kv_bytes;
    uint32_t data_crc;
} dj_session;

// Writes s (ids, n_tokens, n_prompt, n_kv, next, rng, smp, ctx) and positions 0..n_kv-1 of `slot`'s KV cache, in
// the engine's KV type, to out (opened by the caller with out_open), and commits it.
int session_save(dj_out *out, const dj_model *m, dj_engine *eng, int32_t slot, const dj_session *s, dj_err *e);
// Reads path's header and tokens, refusing by name a file that is not a session, of another version, truncated or
// corrupt, of another model (`model_name` in the message) or another context than ctx. The file stays open for
// session_resume; session_close frees.
int session_open(dj_session *s, const char *path, const dj_model *m, const char *model_name, int64_t ctx, dj_err *e);
// The KV cache into `slot` (its checksum with the tokens' checked first), then the next token: the one the
// session holds, or picked by engine_next after feeding the tokens the cache lacks. An engine of another KV type
// than the file's is refused by name (the --kv-type to give). smp: set up by the caller
// (settings, generator, the tokens accepted); logits: (vocab) for the host sampler.
int session_resume(dj_session *s, dj_engine *eng, int32_t slot, dj_sampler *smp, float *logits, int32_t *next,
                   dj_err *e);
void session_close(dj_session *s);  // the file and ids; a zeroed session is fine

#endif
