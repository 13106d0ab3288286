// bench_tokenizer.c: encode/decode throughput (MB/s) of the real Llama tokenizers on ~1 MB of generated English, and
// on 1 MB worst cases (below) so that the slowest input is known too.
// Usage: bench_tokenizer DATA_DIR [OUT.json]. Prints a table; writes the same numbers as JSON when OUT is given.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../convert/tokjson.h"
#include "../tokenizer.h"

static const char *const WORDS[] = {
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not",
    "he", "I", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you", "were",
    "their", "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will", "would", "who",
    "so", "no", "time", "people", "year", "way", "day", "man", "thing", "woman", "life", "child", "world", "school",
    "state", "family", "student", "group", "country", "problem", "hand", "part", "place", "case", "week", "company",
    "system", "program", "question", "work", "government", "number", "night", "point", "home", "water", "room",
    "mother", "area", "money", "story", "fact", "month", "lot", "right", "study", "book", "eye", "job", "word",
    "business", "issue", "side", "kind", "head", "house", "service", "friend", "father", "power", "hour", "game",
    "line", "end", "member", "law", "car", "city", "community", "name", "president", "team", "minute", "idea", "kid",
    "body", "information", "back", "parent", "face", "others", "level", "office", "door", "health", "person", "art",
    "war", "history", "party", "result", "change", "morning", "reason", "research", "girl", "guy", "moment", "air",
    "teacher", "force", "education", "little", "quickly", "beautiful", "understand", "remember", "considering",
    "unbelievable", "don't", "it's", "we'll", "they're", "Once", "upon", "Lily", "garden", "happily", "2024", "3.14",
};

static uint64_t rng = 88172645463325252ull;
static uint32_t next_rand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 20);
}

// ~n bytes of sentences and paragraphs.
static char *make_text(size_t n, size_t *len) {
    char *t = malloc(n + 64);
    size_t at = 0, in_sentence = 0;
    while (at < n) {
        const char *w = WORDS[next_rand() % (sizeof WORDS / sizeof *WORDS)];
        size_t wl = strlen(w);
        if (in_sentence) t[at++] = ' ';
        memcpy(t + at, w, wl);
        if (!in_sentence && w[0] >= 'a' && w[0] <= 'z') t[at] = (char)(w[0] - 32);
        at += wl, in_sentence++;
        uint32_t r = next_rand() % 100;
        if (in_sentence > 4 && r < 12) {
            t[at++] = r < 9 ? '.' : r < 11 ? '?' : '!';
            in_sentence = 0;
            if (next_rand() % 8 == 0) t[at++] = '\n', t[at++] = '\n';
            else t[at++] = ' ';
        } else if (r < 18) {
            t[at++] = ',';
        }
    }
    *len = at;
    return t;
}

// The inputs: generated English, then worst cases: one 1 MB word that BPE must merge whole (the same letter, or
// random letters), the first byte of every special token ('<') at every position, and one 1 MB whitespace run.
enum { IN_ENGLISH, IN_SAME, IN_LETTERS, IN_LT, IN_SPACES, N_INPUTS };
static const char *const INPUTS[N_INPUTS] = {"english", "'a' x 1M", "random a-z", "'<' x 1M", "spaces x 1M"};
static char *make_input(int kind, size_t *len) {
    if (kind == IN_ENGLISH) return make_text(1 << 20, len);
    size_t n = 1 << 20;
    char *t = malloc(n);
    for (size_t i = 0; i < n; i++)
        t[i] = kind == IN_SAME ? 'a' : kind == IN_LETTERS ? (char)('a' + next_rand() % 26) : kind == IN_LT ? '<' : ' ';
    *len = n;
    return t;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s DATA_DIR [OUT.json]\n", argv[0]);
        return 2;
    }
    static const char *const dirs[] = {"tokenizers/llama3", "tokenizers/llama2", "models/stories260K"};
    size_t lens[N_INPUTS];
    char *texts[N_INPUTS];
    for (int in = 0; in < N_INPUTS; in++) texts[in] = make_input(in, &lens[in]);
    FILE *js = argc > 2 ? fopen(argv[2], "w") : NULL;
    if (js) fprintf(js, "{\"text_bytes\": %zu, \"results\": [", lens[IN_ENGLISH]);
    printf("%-20s %-12s %8s %9s %12s %12s %8s\n", "tokenizer", "input", "MB", "tokens", "encode MB/s", "decode MB/s",
           "load ms");
    int first = 1;
    for (size_t d = 0; d < sizeof dirs / sizeof *dirs; d++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s", argv[1], dirs[d]);
        uint8_t *blob;
        size_t n;
        dj_err e;
        if (tokjson_build_dir(dir, &blob, &n, &e)) {
            fprintf(stderr, "bench_tokenizer: skipping %s: %s\n", dirs[d], e.msg);
            continue;
        }
        double t0 = dj_now();
        dj_tokenizer *t = tok_load(blob, n, &e);
        double load = dj_now() - t0;
        if (!t) dj_die("%s", e.msg);
        for (int in = 0; in < N_INPUTS; in++) {
            const char *text = texts[in];
            size_t len = lens[in], k = 0, dl;
            int32_t *ids;
            double best_enc = 1e9, best_dec = 1e9;
            for (int rep = 0; rep < 3; rep++) {
                t0 = dj_now();
                if (tok_encode(t, text, len, 1, &ids, &k, &e)) dj_die("%s", e.msg);
                double t1 = dj_now();
                char *s = tok_decode(t, ids, k, &dl);
                double t2 = dj_now();
                if (!s || dl != len || memcmp(s, text, len) != 0)
                    dj_die("%s, %s: decode(encode(text)) != text", dirs[d], INPUTS[in]);
                if (t1 - t0 < best_enc) best_enc = t1 - t0;
                if (t2 - t1 < best_dec) best_dec = t2 - t1;
                free(s), free(ids);
            }
            double mb = (double)len / 1e6;
            printf("%-20s %-12s %8.3f %9zu %12.2f %12.2f %8.1f\n", dirs[d], INPUTS[in], mb, k, mb / best_enc,
                   mb / best_dec, load * 1e3);
            fflush(stdout);
            if (js)
                fprintf(js, "%s{\"tokenizer\": \"%s\", \"input\": \"%s\", \"bytes\": %zu, \"tokens\": %zu, "
                            "\"encode_mb_s\": %.3f, \"decode_mb_s\": %.3f, \"load_ms\": %.2f}",
                        first ? "" : ", ", dirs[d], INPUTS[in], len, k, mb / best_enc, mb / best_dec, load * 1e3);
            first = 0;
        }
        tok_free(t);
        free(blob);
    }
    if (js) fprintf(js, "]}\n"), fclose(js);
    for (int in = 0; in < N_INPUTS; in++) free(texts[in]);
    return 0;
}
