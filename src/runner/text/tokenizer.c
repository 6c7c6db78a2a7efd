/* runner/text/tokenizer.c - Hugging Face tokenizer.json byte-level BPE: load (jansson), encode
 * (added tokens, Split pre-tokenizer regexes as hand-written matchers, byte-level BPE by merge
 * rank), decode and streaming decode.
 *
 * Representation: every token id has a "piece", the raw bytes it stands for (a vocab token's
 * byte-level string mapped back through the GPT-2 bytes<->unicode table; an added token's
 * content). BPE runs on raw bytes: the initial symbols are the single-byte tokens and merges are
 * looked up by (left id, right id), so encoding never builds byte-level strings.
 *
 * Invariants: after tm_tok_load returns, the tokenizer is never written again, so any number of
 * threads may encode/decode at once; each call keeps its own scratch memory.
 *
 * Not supported (load fails with TM_E_PARSE naming the feature): normalizers other than an
 * empty Sequence (so no NFC: Qwen2's tokenizer.json is rejected), Split regexes other than the
 * known ones (tokenizer_int.h), Split behaviours other than Isolated, ByteLevel with
 * add_prefix_space, added tokens with lstrip/rstrip/single_word, BPE dropout, unk/byte_fallback,
 * continuing_subword_prefix / end_of_word_suffix. tokenizer.json's post_processor is ignored:
 * encode never adds BOS. Added tokens are matched in one pass (leftmost, then longest) whether
 * or not they are "normalized"; HF matches non-normalized ones first, which differs only when
 * two added tokens overlap in the text. */
#include "runner/text/tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/fsutil.h"
#include "base/hash.h"
#include "base/utf8.h"
#include "runner/text/tokenizer_int.h"
#include "runner/text/unicode_tab.h"

#define MAX_PAT 8            /* Split steps in a pre-tokenizer sequence */
#define MAX_VOCAB (1u << 24) /* ids above this are taken for a corrupt file */
#define BPE_NAIVE_MAX 128    /* words up to this many bytes use the simple merge loop */

enum {
    TOKF_PRESENT = 1, /* the id names a token */
    TOKF_ADDED = 2,   /* from added_tokens: matched in raw text; piece is its content */
    TOKF_SPECIAL = 4, /* added token with special: true */
};

typedef struct merge_slot {
    uint64_t key;  /* (left id << 32 | right id) + 1; 0 = empty slot */
    uint32_t rank; /* index in model.merges: lower merges first */
    uint32_t id;   /* the merged token */
} merge_slot;

struct tm_tokenizer {
    uint32_t n_vocab;    /* 1 + largest id */
    char *arena;         /* owned; all pieces */
    uint32_t *piece_off; /* owned [n_vocab]: piece of id = arena + piece_off[id] */
    uint32_t *piece_len; /* owned [n_vocab] bytes */
    uint8_t *flags;      /* owned [n_vocab] TOKF_* */

    uint32_t *vmap; /* owned [vmap_mask + 1]: id + 1 of byte-level vocab tokens by piece */
    uint32_t vmap_mask;
    uint32_t *unclean; /* owned [n_unclean]: vocab ids whose string is not byte-level text */
    uint32_t n_unclean;
    merge_slot *mmap; /* owned [mmap_mask + 1] */
    uint32_t mmap_mask;
    uint32_t byte_id[256]; /* token of each single byte */
    int16_t cp_byte[324];  /* byte-level alphabet: code point -> byte, -1 if not in it */
    int ignore_merges;     /* model.ignore_merges: a word that is a vocab token is not merged */

    uint32_t *amap; /* owned [amap_mask + 1]: id + 1 of added tokens by content */
    uint32_t amap_mask;
    uint8_t added_first[256]; /* 1 if some added token starts with this byte */
    uint32_t added_lens[64];  /* distinct added-token byte lengths, longest first */
    uint32_t n_added_lens;
    uint32_t added_max_len; /* used when there are more than 64 distinct lengths */
    uint32_t max_piece;     /* longest piece in bytes: no token covers more of the text */

    tm_pat pats[MAX_PAT]; /* Split steps, applied in order; the last step is byte-level + BPE */
    uint32_t n_pat;

    char *chat_template; /* owned or NULL */
    char *bos_text;      /* owned, "" if none */
    char *eos_text;      /* owned, "" if none */
    int32_t bos_id, eos_id;
};

/* ---------------------------------------------------------------------------------------------
 * tm_ids */

tm_rc tm_ids_push(tm_ids *v, uint32_t id, tm_err *err) {
    if (v->len == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        uint32_t *p = tm_realloc(v->ids, cap * sizeof(*p));
        if (!p)
            return TM_ERR(err, TM_E_NOMEM, "token id array of %zu", cap);
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->len++] = id;
    return TM_OK;
}

void tm_ids_fini(tm_ids *v) {
    tm_free(v->ids);
    v->ids = NULL;
    v->len = v->cap = 0;
}

/* ---------------------------------------------------------------------------------------------
 * Hashing */

static uint32_t pow2_at_least(size_t n) {
    uint32_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

static uint64_t hash_bytes(const char *p, size_t n) { return tm_hash64(p, n); }

static uint64_t hash_u64(uint64_t x) { return tm_hash_mix64(x); }

static const char *piece(const tm_tokenizer *tok, uint32_t id, size_t *len) {
    *len = tok->piece_len[id];
    return tok->arena + tok->piece_off[id];
}

/* Find p[0..n) in a piece-keyed map (slots hold id + 1). -1 if absent. */
static int32_t map_find(const tm_tokenizer *tok, const uint32_t *map, uint32_t mask, const char *p,
                        size_t n) {
    uint32_t i = (uint32_t)hash_bytes(p, n) & mask;
    for (;;) {
        uint32_t s = map[i];
        if (s == 0)
            return -1;
        size_t len;
        const char *q = piece(tok, s - 1, &len);
        if (len == n && memcmp(p, q, n) == 0)
            return (int32_t)(s - 1);
        i = (i + 1) & mask;
    }
}

/* Insert id by its piece; an existing equal key is replaced (last one wins, as in a JSON
 * object or HF's maps). */
static void map_put(const tm_tokenizer *tok, uint32_t *map, uint32_t mask, uint32_t id) {
    size_t n;
    const char *p = piece(tok, id, &n);
    uint32_t i = (uint32_t)hash_bytes(p, n) & mask;
    for (;;) {
        uint32_t s = map[i];
        if (s == 0) {
            map[i] = id + 1;
            return;
        }
        size_t len;
        const char *q = piece(tok, s - 1, &len);
        if (len == n && memcmp(p, q, n) == 0) {
            map[i] = id + 1;
            return;
        }
        i = (i + 1) & mask;
    }
}

static const merge_slot *merge_find(const tm_tokenizer *tok, uint32_t a, uint32_t b) {
    uint64_t key = (((uint64_t)a << 32) | b) + 1;
    uint32_t i = (uint32_t)hash_u64(key) & tok->mmap_mask;
    for (;;) {
        const merge_slot *s = &tok->mmap[i];
        if (s->key == key)
            return s;
        if (s->key == 0)
            return NULL;
        i = (i + 1) & tok->mmap_mask;
    }
}

static void merge_put(tm_tokenizer *tok, uint32_t a, uint32_t b, uint32_t rank, uint32_t id) {
    uint64_t key = (((uint64_t)a << 32) | b) + 1;
    uint32_t i = (uint32_t)hash_u64(key) & tok->mmap_mask;
    while (tok->mmap[i].key != 0 && tok->mmap[i].key != key)
        i = (i + 1) & tok->mmap_mask;
    tok->mmap[i] = (merge_slot){.key = key, .rank = rank, .id = id};
}

/* ---------------------------------------------------------------------------------------------
 * GPT-2 byte-level alphabet: bytes 0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF stand for themselves; the
 * other 68 bytes map, in order, to U+0100 upwards. */

static uint32_t byte_to_cp(uint32_t b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
        return b;
    uint32_t n = 0; // index of b among the remapped bytes
    for (uint32_t c = 0; c < b; c++)
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF)))
            n++;
    return 256 + n;
}

/* Reverse table: code point (< 324) -> byte, or -1. */
static void build_cp_to_byte(int16_t rev[324]) {
    for (int i = 0; i < 324; i++)
        rev[i] = -1;
    for (uint32_t b = 0; b < 256; b++)
        rev[byte_to_cp(b)] = (int16_t)b;
}

/* Map byte-level text s[0..n) to raw bytes in out (room for n bytes). Returns the byte count,
 * or (size_t)-1 if s has a character outside the alphabet (or is not UTF-8). */
static size_t bytelevel_decode(const int16_t rev[324], const char *s, size_t n, char *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = tm_utf8_decode(s + i, n - i, &cp);
        if (k == 0 || cp >= 324 || rev[cp] < 0)
            return (size_t)-1;
        out[o++] = (char)rev[cp];
        i += k;
    }
    return o;
}

/* ---------------------------------------------------------------------------------------------
 * Pre-tokenizer patterns */

static const char *const pat_src[TM_PAT_COUNT] = {
    [TM_PAT_DS_DIGITS] = "\\p{N}{1,3}",
    [TM_PAT_DS_CJK] = "[一-龥぀-ゟ゠-ヿ]+",
    [TM_PAT_DS_MAIN] = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|"
                       "[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
                       " ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    [TM_PAT_GPT2] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"
                    "\\s+(?!\\S)|\\s+",
    [TM_PAT_LLAMA3] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
                      " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    [TM_PAT_QWEN2] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
                     " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};

const char *tm_pat_source(tm_pat pat) {
    TM_ASSERT(pat < TM_PAT_COUNT);
    return pat_src[pat];
}

int tm_pat_lookup(const char *regex) {
    for (int p = 0; p < TM_PAT_COUNT; p++) {
        // compare, reading a literal CR/LF in regex as the escape \r / \n
        const char *a = regex, *b = pat_src[p];
        for (;;) {
            if (*a == '\r' || *a == '\n') {
                if (b[0] != '\\' || b[1] != (*a == '\r' ? 'r' : 'n'))
                    break;
                a++;
                b += 2;
                continue;
            }
            if (*a != *b)
                break;
            if (*a == '\0')
                return p;
            a++;
            b++;
        }
    }
    return -1;
}

static inline uint32_t ucf(uint32_t c) { return tm_uc_flags(c); }

static inline int is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }

static inline int is_ascii_alpha(uint32_t c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static inline int is_ascii_punct(uint32_t c) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
           (c >= 0x7B && c <= 0x7E);
}

static inline int is_ds_cjk(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x309F) ||
           (c >= 0x30A0 && c <= 0x30FF);
}

/* First j >= i (j <= end) whose class bits miss mask. */
static size_t run_any(const uint32_t *cp, size_t i, size_t end, uint32_t mask) {
    while (i < end && (ucf(cp[i]) & mask))
        i++;
    return i;
}

/* First j >= i whose character has some of the bits in mask (i.e. the run of [^mask]). */
static size_t run_none(const uint32_t *cp, size_t i, size_t end, uint32_t mask) {
    while (i < end && !(ucf(cp[i]) & mask))
        i++;
    return i;
}

/* The whitespace tail shared by most patterns, at a whitespace cp[i]:
 * [with_crlf: \s*[\r\n]+ |] \s+(?!\S) | \s+ */
static size_t match_ws(const uint32_t *cp, size_t i, size_t end, int with_crlf) {
    size_t r = run_any(cp, i, end, TM_UC_WS);
    if (with_crlf) {
        // \s*[\r\n]+: greedy \s* backs off to the last CR/LF of the run; [\r\n]+ takes it
        for (size_t k = r; k > i; k--)
            if (is_crlf(cp[k - 1]))
                return k - i;
    }
    if (r == end)
        return r - i; // \s+(?!\S) at the end of input
    if (r - i >= 2)
        return r - 1 - i; // \s+(?!\S) backs off one so a space precedes the \S
    return r - i;         // \s+
}

/* Contractions 's|'t|'re|'ve|'m|'ll|'d at cp[i] == '\''. With fold, case-insensitive as
 * Oniguruma's (?i:) does it: Unicode simple case folding, so U+017F (long s) matches s. */
static size_t match_contraction(const uint32_t *cp, size_t i, size_t end, int fold) {
    if (i + 1 >= end)
        return 0;
    uint32_t a = cp[i + 1], b = i + 2 < end ? cp[i + 2] : 0;
    if (fold) {
        if (a == 0x17F)
            a = 's';
        if (a < 128)
            a |= 0x20 * (a >= 'A' && a <= 'Z');
        if (b < 128)
            b |= 0x20 * (b >= 'A' && b <= 'Z');
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

size_t tm_pat_match(tm_pat pat, const uint32_t *cp, size_t i, size_t end) {
    const uint32_t c = cp[i], f = ucf(c);
    const uint32_t c1 = i + 1 < end ? cp[i + 1] : 0, f1 = i + 1 < end ? ucf(c1) : 0;
    switch (pat) {
    case TM_PAT_DS_DIGITS: {
        if (!(f & TM_UC_N))
            return 0;
        size_t j = i + 1;
        while (j < end && j < i + 3 && (ucf(cp[j]) & TM_UC_N))
            j++;
        return j - i;
    }
    case TM_PAT_DS_CJK: {
        size_t j = i;
        while (j < end && is_ds_cjk(cp[j]))
            j++;
        return j - i;
    }
    case TM_PAT_DS_MAIN: {
        // [!"#...~][A-Za-z]+
        if (c < 128 && is_ascii_punct(c) && i + 1 < end && is_ascii_alpha(c1)) {
            size_t j = i + 1;
            while (j < end && is_ascii_alpha(cp[j]))
                j++;
            return j - i;
        }
        // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
        if (!is_crlf(c) && !(f & (TM_UC_L | TM_UC_P | TM_UC_S)) && (f1 & (TM_UC_L | TM_UC_M)))
            return run_any(cp, i + 1, end, TM_UC_L | TM_UC_M) - i;
        if (f & (TM_UC_L | TM_UC_M))
            return run_any(cp, i, end, TM_UC_L | TM_UC_M) - i;
        //  ?[\p{P}\p{S}]+[\r\n]*
        size_t j = i;
        if (c == ' ' && (f1 & (TM_UC_P | TM_UC_S)))
            j = i + 1;
        if (ucf(cp[j]) & (TM_UC_P | TM_UC_S)) {
            j = run_any(cp, j, end, TM_UC_P | TM_UC_S);
            while (j < end && is_crlf(cp[j]))
                j++;
            return j - i;
        }
        if (f & TM_UC_WS)
            return match_ws(cp, i, end, 1);
        return 0;
    }
    case TM_PAT_GPT2: {
        if (c == '\'') {
            size_t k = match_contraction(cp, i, end, 0);
            if (k)
                return k;
        }
        //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+
        if (c == ' ' && (f1 & TM_UC_L))
            return run_any(cp, i + 1, end, TM_UC_L) - i;
        if (f & TM_UC_L)
            return run_any(cp, i, end, TM_UC_L) - i;
        if (c == ' ' && (f1 & TM_UC_N))
            return run_any(cp, i + 1, end, TM_UC_N) - i;
        if (f & TM_UC_N)
            return run_any(cp, i, end, TM_UC_N) - i;
        const uint32_t other = TM_UC_WS | TM_UC_L | TM_UC_N;
        if (c == ' ' && i + 1 < end && !(f1 & other))
            return run_none(cp, i + 1, end, other) - i;
        if (!(f & other))
            return run_none(cp, i, end, other) - i;
        if (f & TM_UC_WS)
            return match_ws(cp, i, end, 0);
        return 0;
    }
    case TM_PAT_LLAMA3:
    case TM_PAT_QWEN2: {
        if (c == '\'') {
            size_t k = match_contraction(cp, i, end, 1);
            if (k)
                return k;
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if (!is_crlf(c) && !(f & (TM_UC_L | TM_UC_N)) && (f1 & TM_UC_L))
            return run_any(cp, i + 1, end, TM_UC_L) - i;
        if (f & TM_UC_L)
            return run_any(cp, i, end, TM_UC_L) - i;
        // \p{N}{1,3} (Llama 3) or \p{N} (Qwen2)
        if (f & TM_UC_N) {
            size_t max = pat == TM_PAT_LLAMA3 ? 3 : 1, j = i + 1;
            while (j < end && j < i + max && (ucf(cp[j]) & TM_UC_N))
                j++;
            return j - i;
        }
        //  ?[^\s\p{L}\p{N}]+[\r\n]*
        const uint32_t other = TM_UC_WS | TM_UC_L | TM_UC_N;
        size_t j = 0;
        if (c == ' ' && i + 1 < end && !(f1 & other))
            j = run_none(cp, i + 1, end, other);
        else if (!(f & other))
            j = run_none(cp, i, end, other);
        if (j > 0) {
            while (j < end && is_crlf(cp[j]))
                j++;
            return j - i;
        }
        if (f & TM_UC_WS)
            return match_ws(cp, i, end, 1);
        return 0;
    }
    default:
        TM_ASSERT(0);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Per-call scratch memory (each encode call owns one; the tokenizer stays read-only). */

typedef struct heap_ent {
    uint32_t rank; /* merge rank of the pair starting at pos */
    uint32_t pos;  /* symbol index (byte offset in the word) */
} heap_ent;

typedef struct scratch {
    uint32_t *cp;  /* [cap_cp] code points of the current segment */
    uint32_t *off; /* [cap_cp + 1] byte offset of each code point */
    size_t cap_cp;
    uint32_t *sym; /* [cap_sym] token id of each BPE symbol */
    int32_t *prev; /* [cap_sym] heap variant: linked list of live symbols */
    int32_t *next;
    uint32_t *rank; /* [cap_sym] naive variant: rank of pair (i, i+1) */
    size_t cap_sym;
    heap_ent *heap; /* [cap_heap] */
    size_t n_heap, cap_heap;
    size_t max_ids; /* tm_tok_encode_max's bound on out->len */
    int over;       /* set once out must hold more than max_ids: encoding stops */
} scratch;

static void scratch_fini(scratch *s) {
    tm_free(s->cp);
    tm_free(s->off);
    tm_free(s->sym);
    tm_free(s->prev);
    tm_free(s->next);
    tm_free(s->rank);
    tm_free(s->heap);
}

static tm_rc scratch_cp(scratch *s, size_t n, tm_err *err) {
    if (n <= s->cap_cp)
        return TM_OK;
    tm_free(s->cp);
    tm_free(s->off);
    s->cap_cp = 0;
    s->cp = tm_malloc(n * sizeof(*s->cp));
    s->off = tm_malloc((n + 1) * sizeof(*s->off));
    if (!s->cp || !s->off)
        return TM_ERR(err, TM_E_NOMEM, "tokenizer scratch for %zu code points", n);
    s->cap_cp = n;
    return TM_OK;
}

static tm_rc scratch_sym(scratch *s, size_t n, tm_err *err) {
    if (n <= s->cap_sym)
        return TM_OK;
    tm_free(s->sym);
    tm_free(s->prev);
    tm_free(s->next);
    tm_free(s->rank);
    s->cap_sym = 0;
    s->sym = tm_malloc(n * sizeof(*s->sym));
    s->prev = tm_malloc(n * sizeof(*s->prev));
    s->next = tm_malloc(n * sizeof(*s->next));
    s->rank = tm_malloc(n * sizeof(*s->rank));
    if (!s->sym || !s->prev || !s->next || !s->rank)
        return TM_ERR(err, TM_E_NOMEM, "tokenizer scratch for a %zu-byte word", n);
    s->cap_sym = n;
    return TM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * BPE */

static int heap_less(heap_ent a, heap_ent b) {
    return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos;
}

static tm_rc heap_push(scratch *s, heap_ent e, tm_err *err) {
    if (s->n_heap == s->cap_heap) {
        size_t cap = s->cap_heap ? s->cap_heap * 2 : 256;
        heap_ent *h = tm_realloc(s->heap, cap * sizeof(*h));
        if (!h)
            return TM_ERR(err, TM_E_NOMEM, "BPE heap of %zu", cap);
        s->heap = h;
        s->cap_heap = cap;
    }
    size_t i = s->n_heap++;
    while (i > 0 && heap_less(e, s->heap[(i - 1) / 2])) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = e;
    return TM_OK;
}

static heap_ent heap_pop(scratch *s) {
    heap_ent top = s->heap[0], last = s->heap[--s->n_heap];
    size_t i = 0, n = s->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && heap_less(s->heap[c + 1], s->heap[c]))
            c++;
        if (!heap_less(s->heap[c], last))
            break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n > 0)
        s->heap[i] = last;
    return top;
}

/* Short words: keep the rank of every adjacent pair and merge the lowest (leftmost on ties)
 * until none is left. O(n^2) compares but only O(n) hash lookups. */
static tm_rc bpe_naive(const tm_tokenizer *tok, scratch *s, size_t n, tm_ids *out, tm_err *err) {
    uint32_t *sym = s->sym, *rank = s->rank;
    for (size_t i = 0; i + 1 < n; i++) {
        const merge_slot *m = merge_find(tok, sym[i], sym[i + 1]);
        rank[i] = m ? m->rank : UINT32_MAX;
    }
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best])
                best = i;
        if (rank[best] == UINT32_MAX)
            break;
        sym[best] = merge_find(tok, sym[best], sym[best + 1])->id;
        memmove(sym + best + 1, sym + best + 2, (n - best - 2) * sizeof(*sym));
        memmove(rank + best + 1, rank + best + 2, (n - best - 2) * sizeof(*rank));
        n--;
        if (best > 0) {
            const merge_slot *m = merge_find(tok, sym[best - 1], sym[best]);
            rank[best - 1] = m ? m->rank : UINT32_MAX;
        }
        if (best + 1 < n) {
            const merge_slot *m = merge_find(tok, sym[best], sym[best + 1]);
            rank[best] = m ? m->rank : UINT32_MAX;
        }
    }
    for (size_t i = 0; i < n; i++) {
        tm_rc rc = tm_ids_push(out, sym[i], err);
        if (rc)
            return rc;
    }
    return TM_OK;
}

/* Long words: a min-heap of (rank, position) with lazy deletion, as HF does; O(n log n). */
static tm_rc bpe_heap(const tm_tokenizer *tok, scratch *s, size_t n, tm_ids *out, tm_err *err) {
    uint32_t *sym = s->sym;
    int32_t *prev = s->prev, *next = s->next;
    tm_rc rc;
    s->n_heap = 0;
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        const merge_slot *m = merge_find(tok, sym[i], sym[i + 1]);
        if (m) {
            rc = heap_push(s, (heap_ent){m->rank, (uint32_t)i}, err);
            if (rc)
                return rc;
        }
    }
    // hot loop: one merge per valid heap entry
    while (s->n_heap > 0) {
        heap_ent e = heap_pop(s);
        int32_t p = (int32_t)e.pos, q = next[p];
        if (sym[p] == UINT32_MAX || q < 0)
            continue; // merged away, or now last
        const merge_slot *m = merge_find(tok, sym[p], sym[q]);
        if (!m || m->rank != e.rank)
            continue; // stale: a neighbour changed
        sym[p] = m->id;
        sym[q] = UINT32_MAX;
        next[p] = next[q];
        if (next[q] >= 0)
            prev[next[q]] = p;
        if (prev[p] >= 0) {
            const merge_slot *ml = merge_find(tok, sym[prev[p]], sym[p]);
            if (ml) {
                rc = heap_push(s, (heap_ent){ml->rank, (uint32_t)prev[p]}, err);
                if (rc)
                    return rc;
            }
        }
        if (next[p] >= 0) {
            const merge_slot *mr = merge_find(tok, sym[p], sym[next[p]]);
            if (mr) {
                rc = heap_push(s, (heap_ent){mr->rank, (uint32_t)p}, err);
                if (rc)
                    return rc;
            }
        }
    }
    for (int32_t i = 0; i >= 0; i = next[i]) {
        rc = tm_ids_push(out, sym[i], err);
        if (rc)
            return rc;
    }
    return TM_OK;
}

/* One pre-tokenized word (raw bytes) -> ids. */
static tm_rc bpe_word(const tm_tokenizer *tok, const char *w, size_t n, scratch *s, tm_ids *out,
                      tm_err *err) {
    if (n == 0)
        return TM_OK;
    if (n == 1)
        return tm_ids_push(out, tok->byte_id[(uint8_t)w[0]], err);
    if (tok->ignore_merges) {
        int32_t id = map_find(tok, tok->vmap, tok->vmap_mask, w, n);
        if (id >= 0)
            return tm_ids_push(out, (uint32_t)id, err);
    }
    tm_rc rc = scratch_sym(s, n, err);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++)
        s->sym[i] = tok->byte_id[(uint8_t)w[i]];
    return n <= BPE_NAIVE_MAX ? bpe_naive(tok, s, n, out, err) : bpe_heap(tok, s, n, out, err);
}

/* Whether n more bytes of text certainly take out past s->max_ids: each token covers at most
 * max_piece bytes, so they are at least ceil(n / max_piece) tokens. Sets s->over if so. */
static int over_bound(const tm_tokenizer *tok, scratch *s, const tm_ids *out, size_t n) {
    if (n > 0 && (out->len > s->max_ids || (n - 1) / tok->max_piece + 1 > s->max_ids - out->len))
        s->over = 1;
    return s->over;
}

/* Apply Split step `level` to code points [a, b) of seg; the last level runs BPE. Stops early
 * (TM_OK, s->over set) once out holds more than s->max_ids ids. */
static tm_rc pretok(const tm_tokenizer *tok, uint32_t level, size_t a, size_t b, const char *seg,
                    scratch *s, tm_ids *out, tm_err *err) {
    if (level == tok->n_pat) {
        size_t n = s->off[b] - s->off[a];
        if (over_bound(tok, s, out, n))
            return TM_OK;
        tm_rc rc = bpe_word(tok, seg + s->off[a], n, s, out, err);
        s->over |= out->len > s->max_ids;
        return rc;
    }
    tm_rc rc;
    size_t gap = a, i = a;
    while (i < b) {
        size_t len = tm_pat_match(tok->pats[level], s->cp, i, b);
        if (len == 0) {
            i++;
            continue;
        }
        if (gap < i) {
            rc = pretok(tok, level + 1, gap, i, seg, s, out, err);
            if (rc || s->over)
                return rc;
        }
        rc = pretok(tok, level + 1, i, i + len, seg, s, out, err);
        if (rc || s->over)
            return rc;
        i += len;
        gap = i;
    }
    if (gap < b)
        return pretok(tok, level + 1, gap, b, seg, s, out, err);
    return TM_OK;
}

/* Decode seg[0..n) (valid UTF-8) into s->cp / s->off; returns the code point count. */
static size_t load_cps(scratch *s, const char *seg, size_t n) {
    size_t k = 0, i = 0;
    while (i < n) {
        uint32_t cp;
        size_t len = tm_utf8_decode(seg + i, n - i, &cp);
        TM_ASSERT(len > 0);
        s->cp[k] = cp;
        s->off[k++] = (uint32_t)i;
        i += len;
    }
    s->off[k] = (uint32_t)n;
    return k;
}

/* Text between added tokens. */
static tm_rc encode_segment(const tm_tokenizer *tok, const char *seg, size_t n, scratch *s,
                            tm_ids *out, tm_err *err) {
    if (n == 0 || over_bound(tok, s, out, n))
        return TM_OK;
    tm_rc rc = scratch_cp(s, n, err);
    if (rc)
        return rc;
    size_t ncp = load_cps(s, seg, n);
    return pretok(tok, 0, 0, ncp, seg, s, out, err);
}

/* Longest added token at text[0..n); its id and length, or 0. */
static size_t match_added(const tm_tokenizer *tok, const char *text, size_t n, uint32_t *id) {
    if (tok->n_added_lens > 0) {
        for (uint32_t k = 0; k < tok->n_added_lens; k++) {
            uint32_t len = tok->added_lens[k];
            if (len > n)
                continue;
            int32_t a = map_find(tok, tok->amap, tok->amap_mask, text, len);
            if (a >= 0) {
                *id = (uint32_t)a;
                return len;
            }
        }
        return 0;
    }
    for (size_t len = TM_MIN(n, tok->added_max_len); len > 0; len--) {
        int32_t a = map_find(tok, tok->amap, tok->amap_mask, text, len);
        if (a >= 0) {
            *id = (uint32_t)a;
            return len;
        }
    }
    return 0;
}

tm_rc tm_tok_encode(const tm_tokenizer *tok, const char *text, size_t n, tm_ids *out, tm_err *err) {
    int over;
    return tm_tok_encode_max(tok, text, n, SIZE_MAX, out, &over, err);
}

tm_rc tm_tok_encode_max(const tm_tokenizer *tok, const char *text, size_t n, size_t max_len,
                        tm_ids *out, int *over, tm_err *err) {
    *over = 0;
    size_t valid = tm_utf8_valid_prefix(text, n);
    if (valid != n)
        return TM_ERR(err, TM_E_INVAL, "tokenizer: invalid UTF-8 at byte %zu", valid);
    if (n > UINT32_MAX - 1)
        return TM_ERR(err, TM_E_INVAL, "tokenizer: text of %zu bytes is too long", n);
    scratch s = {.max_ids = max_len};
    tm_rc rc = TM_OK;
    size_t seg = 0, i = 0;
    // The whole text takes at least ceil(n / max_piece) tokens: past the bound, stop before any
    // work (a 200 MB prompt costs its UTF-8 check, not its tokenization).
    if (over_bound(tok, &s, out, n))
        goto done;
    while (i < n) {
        uint32_t id, len = 0;
        if (tok->added_first[(uint8_t)text[i]])
            len = (uint32_t)match_added(tok, text + i, n - i, &id);
        if (len == 0) {
            i++;
            continue;
        }
        rc = encode_segment(tok, text + seg, i - seg, &s, out, err);
        if (rc || s.over)
            goto done;
        rc = tm_ids_push(out, id, err);
        s.over |= out->len > s.max_ids;
        if (rc || s.over)
            goto done;
        i += len;
        seg = i;
    }
    rc = encode_segment(tok, text + seg, n - seg, &s, out, err);
done:
    scratch_fini(&s);
    *over = rc == TM_OK && s.over;
    return rc;
}

tm_rc tm_pat_split(tm_pat pat, const char *text, size_t n, tm_ids *out, tm_err *err) {
    if (tm_utf8_valid_prefix(text, n) != n)
        return TM_ERR(err, TM_E_INVAL, "tm_pat_split: invalid UTF-8");
    scratch s = {0};
    tm_rc rc = scratch_cp(&s, n ? n : 1, err);
    if (rc)
        goto done;
    size_t ncp = load_cps(&s, text, n), gap = 0, i = 0;
    while (i < ncp) {
        size_t len = tm_pat_match(pat, s.cp, i, ncp);
        if (len == 0) {
            i++;
            continue;
        }
        if (gap < i) {
            rc = tm_ids_push(out, s.off[i] - s.off[gap], err);
            if (rc)
                goto done;
        }
        rc = tm_ids_push(out, s.off[i + len] - s.off[i], err);
        if (rc)
            goto done;
        i += len;
        gap = i;
    }
    if (gap < ncp)
        rc = tm_ids_push(out, s.off[ncp] - s.off[gap], err);
done:
    scratch_fini(&s);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Decoding */

tm_rc tm_tok_decode(const tm_tokenizer *tok, const uint32_t *ids, size_t n, tm_buf *out,
                    tm_err *err) {
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= tok->n_vocab || !(tok->flags[ids[i]] & TOKF_PRESENT))
            return TM_ERR(err, TM_E_INVAL, "tokenizer: decode: no token with id %u", ids[i]);
        size_t len;
        const char *p = piece(tok, ids[i], &len);
        tm_rc rc = tm_buf_append(out, p, len, err);
        if (rc)
            return rc;
    }
    return TM_OK;
}

enum { U8_COMPLETE, U8_INCOMPLETE, U8_INVALID };

/* Classify the UTF-8 sequence at b[0..n): a whole character (*len = its length), the start of
 * one cut short by the end of b, or invalid (*len = the maximal subpart to replace by U+FFFD,
 * >= 1, per Unicode's "substitution of maximal subparts"). */
static int u8_check(const unsigned char *b, size_t n, size_t *len) {
    size_t need = tm_utf8_seq_len(b[0]);
    if (need == 0) {
        *len = 1;
        return U8_INVALID;
    }
    for (size_t j = 1; j < need; j++) {
        if (j >= n)
            return U8_INCOMPLETE;
        unsigned char lo = 0x80, hi = 0xBF;
        if (j == 1) {
            if (b[0] == 0xE0)
                lo = 0xA0;
            else if (b[0] == 0xED)
                hi = 0x9F;
            else if (b[0] == 0xF0)
                lo = 0x90;
            else if (b[0] == 0xF4)
                hi = 0x8F;
        }
        if (b[j] < lo || b[j] > hi) {
            *len = j;
            return U8_INVALID;
        }
    }
    *len = need;
    return U8_COMPLETE;
}

static const char replacement[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */

tm_rc tm_detok_push(const tm_tokenizer *tok, tm_detok *st, uint32_t id, int skip_special,
                    tm_buf *out, tm_err *err) {
    if (id >= tok->n_vocab || !(tok->flags[id] & TOKF_PRESENT))
        return TM_ERR(err, TM_E_INVAL, "tokenizer: decode: no token with id %u", id);
    if (skip_special && (tok->flags[id] & TOKF_SPECIAL))
        return TM_OK;
    size_t n;
    const char *p = piece(tok, id, &n);
    tm_rc rc;
    size_t i = 0;
    // finish the pending character first, a byte at a time (it is at most 3 bytes long)
    while (st->n_pending > 0 && i < n) {
        st->pending[st->n_pending++] = p[i++];
        size_t len;
        int k = u8_check((const unsigned char *)st->pending, st->n_pending, &len);
        if (k == U8_INCOMPLETE)
            continue;
        uint32_t np = st->n_pending;
        st->n_pending = 0;
        if (k == U8_COMPLETE) {
            rc = tm_buf_append(out, st->pending, len, err);
            if (rc)
                return rc;
            continue;
        }
        // pending was a valid prefix, so the byte just added broke it: replace the prefix and
        // read that byte again as the start of a new character
        TM_ASSERT(len == np - 1);
        rc = tm_buf_append(out, replacement, 3, err);
        if (rc)
            return rc;
        i--;
    }
    // bulk: the longest valid prefix in one append, then handle what stops it
    while (i < n) {
        size_t v = tm_utf8_valid_prefix(p + i, n - i);
        rc = tm_buf_append(out, p + i, v, err);
        if (rc)
            return rc;
        i += v;
        if (i == n)
            break;
        size_t len;
        int k = u8_check((const unsigned char *)p + i, n - i, &len);
        if (k == U8_INCOMPLETE) {
            memcpy(st->pending, p + i, n - i);
            st->n_pending = (uint32_t)(n - i);
            break;
        }
        TM_ASSERT(k == U8_INVALID);
        rc = tm_buf_append(out, replacement, 3, err);
        if (rc)
            return rc;
        i += len;
    }
    return TM_OK;
}

tm_rc tm_detok_flush(tm_detok *st, tm_buf *out, tm_err *err) {
    if (st->n_pending == 0)
        return TM_OK;
    st->n_pending = 0;
    return tm_buf_append(out, replacement, 3, err);
}

/* ---------------------------------------------------------------------------------------------
 * Queries */

uint32_t tm_tok_n_vocab(const tm_tokenizer *tok) { return tok->n_vocab; }

int32_t tm_tok_bos_id(const tm_tokenizer *tok) { return tok->bos_id; }

int32_t tm_tok_eos_id(const tm_tokenizer *tok) { return tok->eos_id; }

int tm_tok_is_special(const tm_tokenizer *tok, uint32_t id) {
    return id < tok->n_vocab && (tok->flags[id] & TOKF_SPECIAL) != 0;
}

const char *tm_tok_piece(const tm_tokenizer *tok, uint32_t id, size_t *len) {
    if (id >= tok->n_vocab || !(tok->flags[id] & TOKF_PRESENT))
        return NULL;
    return piece(tok, id, len);
}

const char *tm_tok_chat_template(const tm_tokenizer *tok) { return tok->chat_template; }

const char *tm_tok_bos_text(const tm_tokenizer *tok) { return tok->bos_text ? tok->bos_text : ""; }

const char *tm_tok_eos_text(const tm_tokenizer *tok) { return tok->eos_text ? tok->eos_text : ""; }

int32_t tm_tok_find(const tm_tokenizer *tok, const char *str) {
    size_t n = strlen(str);
    if (n == 0)
        return -1;
    int32_t id = map_find(tok, tok->amap, tok->amap_mask, str, n);
    if (id >= 0)
        return id;
    // a vocab token: its byte-level spelling maps to the raw bytes we key the vocab by
    char stack[512];
    char *raw = n <= sizeof(stack) ? stack : tm_malloc(n);
    if (raw) {
        size_t len = bytelevel_decode(tok->cp_byte, str, n, raw);
        if (len != (size_t)-1)
            id = map_find(tok, tok->vmap, tok->vmap_mask, raw, len);
        if (raw != stack)
            tm_free(raw);
        if (id >= 0)
            return id;
    }
    // vocab strings that are not byte-level text are kept as their own bytes
    for (uint32_t k = 0; k < tok->n_unclean; k++) {
        size_t len;
        const char *p = piece(tok, tok->unclean[k], &len);
        if (len == n && memcmp(p, str, n) == 0)
            return (int32_t)tok->unclean[k];
    }
    return -1;
}

/* ---------------------------------------------------------------------------------------------
 * Loading */

void tm_tok_destroy(tm_tokenizer *tok) {
    if (!tok)
        return;
    tm_free(tok->arena);
    tm_free(tok->piece_off);
    tm_free(tok->piece_len);
    tm_free(tok->flags);
    tm_free(tok->vmap);
    tm_free(tok->unclean);
    tm_free(tok->mmap);
    tm_free(tok->amap);
    tm_free(tok->chat_template);
    tm_free(tok->bos_text);
    tm_free(tok->eos_text);
    tm_free(tok);
}

/* Read a whole file. With missing_ok, a file that does not exist gives TM_OK and *out NULL. */
static tm_rc read_file(const char *path, int missing_ok, char **out, size_t *len, tm_err *err) {
    *out = NULL;
    *len = 0;
    FILE *f = NULL; // never blocks on a FIFO; only a regular file is read (issue 35)
    tm_rc orc = tm_fs_fopen_in(path, "tokenizer", &f, err);
    if (orc) {
        if (missing_ok && errno == ENOENT)
            return TM_OK;
        return orc;
    }
    char *buf = NULL;
    size_t cap = 0, n = 0;
    tm_rc rc = TM_OK;
    if (fseek(f, 0, SEEK_END) == 0) {
        long size = ftell(f);
        if (size > 0)
            cap = (size_t)size + 1;
        rewind(f);
    }
    for (;;) {
        if (!buf || n + 1 >= cap) {
            size_t ncap = !buf && cap ? cap + 1 : cap ? cap * 2 : 65536; // +1: see EOF at once
            char *p = tm_realloc(buf, ncap);
            if (!p) {
                rc = TM_ERR(err, TM_E_NOMEM, "%s: %zu bytes", path, ncap);
                break;
            }
            buf = p;
            cap = ncap;
        }
        size_t want = cap - n - 1, got = fread(buf + n, 1, want, f);
        n += got;
        if (got < want) {
            if (ferror(f))
                rc = TM_ERR(err, TM_E_IO, "%s: read error", path);
            break;
        }
    }
    fclose(f);
    if (rc) {
        tm_free(buf);
        return rc;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return TM_OK;
}

static tm_rc parse_json(const char *text, size_t len, const char *path, json_t **out, tm_err *err) {
    json_error_t jerr;
    *out = json_loadb(text, len, 0, &jerr);
    if (!*out)
        return TM_ERR(err, TM_E_PARSE, "%s:%d:%d: %s", path, jerr.line, jerr.column, jerr.text);
    return TM_OK;
}

static tm_rc load_json(const char *path, int missing_ok, json_t **out, tm_err *err) {
    char *text;
    size_t len;
    *out = NULL;
    tm_rc rc = read_file(path, missing_ok, &text, &len, err);
    if (rc || !text)
        return rc;
    rc = parse_json(text, len, path, out, err);
    tm_free(text);
    return rc;
}

static int json_is_falsy(const json_t *v) { return !v || json_is_null(v) || json_is_false(v); }

static const char *json_type_str(const json_t *obj) {
    const char *t = json_string_value(json_object_get(obj, "type"));
    return t ? t : "(no type)";
}

static tm_rc parse_normalizer(const json_t *nz, const char *path, tm_err *err) {
    if (!nz || json_is_null(nz))
        return TM_OK;
    const char *type = json_type_str(nz);
    if (json_is_object(nz) && strcmp(type, "Sequence") == 0) {
        const json_t *list = json_object_get(nz, "normalizers");
        size_t i;
        const json_t *v;
        json_array_foreach(list, i, v) {
            tm_rc rc = parse_normalizer(v, path, err);
            if (rc)
                return rc;
        }
        return TM_OK;
    }
    return TM_ERR(err, TM_E_PARSE, "%s: normalizer %s is not supported", path, type);
}

static tm_rc parse_pretok(tm_tokenizer *tok, const json_t *pt, int *saw_bytelevel, const char *path,
                          tm_err *err) {
    if (!json_is_object(pt))
        return TM_ERR(err, TM_E_PARSE, "%s: pre_tokenizer is not an object", path);
    const char *type = json_type_str(pt);
    if (*saw_bytelevel)
        return TM_ERR(err, TM_E_PARSE, "%s: pre_tokenizer %s after ByteLevel is not supported",
                      path, type);
    if (strcmp(type, "Sequence") == 0) {
        const json_t *list = json_object_get(pt, "pretokenizers");
        if (!json_is_array(list))
            return TM_ERR(err, TM_E_PARSE, "%s: pre_tokenizer Sequence without pretokenizers",
                          path);
        size_t i;
        const json_t *v;
        json_array_foreach(list, i, v) {
            tm_rc rc = parse_pretok(tok, v, saw_bytelevel, path, err);
            if (rc)
                return rc;
        }
        return TM_OK;
    }
    if (strcmp(type, "Split") == 0) {
        const json_t *pat = json_object_get(pt, "pattern");
        const char *re = json_string_value(json_object_get(pat, "Regex"));
        if (!re)
            return TM_ERR(err, TM_E_PARSE,
                          "%s: pre_tokenizer Split: only Regex patterns are "
                          "supported",
                          path);
        int p = tm_pat_lookup(re);
        if (p < 0)
            return TM_ERR(err, TM_E_PARSE,
                          "%s: pre_tokenizer Split regex is not one tokenmill "
                          "knows (DeepSeek V3, Llama 3, Qwen2, GPT-2): \"%.300s\"",
                          path, re);
        const char *behavior = json_string_value(json_object_get(pt, "behavior"));
        if (!behavior || strcmp(behavior, "Isolated") != 0)
            return TM_ERR(err, TM_E_PARSE,
                          "%s: pre_tokenizer Split behavior %s is not supported "
                          "(only Isolated)",
                          path, behavior ? behavior : "(none)");
        if (!json_is_falsy(json_object_get(pt, "invert")))
            return TM_ERR(err, TM_E_PARSE, "%s: pre_tokenizer Split invert is not supported", path);
        if (tok->n_pat == MAX_PAT)
            return TM_ERR(err, TM_E_PARSE, "%s: more than %d Split pre-tokenizers", path, MAX_PAT);
        tok->pats[tok->n_pat++] = (tm_pat)p;
        return TM_OK;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        if (!json_is_falsy(json_object_get(pt, "add_prefix_space")))
            return TM_ERR(err, TM_E_PARSE, "%s: ByteLevel add_prefix_space is not supported", path);
        const json_t *use_regex = json_object_get(pt, "use_regex"); // HF default: true
        if (!json_is_falsy(use_regex) || !use_regex) {
            if (tok->n_pat == MAX_PAT)
                return TM_ERR(err, TM_E_PARSE, "%s: too many pre-tokenizers", path);
            tok->pats[tok->n_pat++] = TM_PAT_GPT2;
        }
        *saw_bytelevel = 1;
        return TM_OK;
    }
    return TM_ERR(err, TM_E_PARSE, "%s: pre_tokenizer %s is not supported", path, type);
}

/* An id from a JSON value: an integer in [0, MAX_VOCAB), else -1. */
static int64_t json_id(const json_t *v) {
    if (!json_is_integer(v))
        return -1;
    json_int_t x = json_integer_value(v);
    return x >= 0 && x < (json_int_t)MAX_VOCAB ? (int64_t)x : -1;
}

static tm_rc parse_model(tm_tokenizer *tok, const json_t *root, const char *path, tm_err *err) {
    const json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return TM_ERR(err, TM_E_PARSE, "%s: no \"model\" object", path);
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (mtype && strcmp(mtype, "BPE") != 0)
        return TM_ERR(err, TM_E_PARSE, "%s: model type %s is not supported (only BPE)", path,
                      mtype);
    const json_t *vocab = json_object_get(model, "vocab");
    const json_t *merges = json_object_get(model, "merges");
    const json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab) || json_object_size(vocab) == 0)
        return TM_ERR(err, TM_E_PARSE, "%s: model.vocab is missing or empty", path);
    if (!json_is_array(merges))
        return TM_ERR(err, TM_E_PARSE, "%s: model.merges is missing", path);
    if (added && !json_is_null(added) && !json_is_array(added))
        return TM_ERR(err, TM_E_PARSE, "%s: added_tokens is not an array", path);
    const json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0.0)
        return TM_ERR(err, TM_E_PARSE, "%s: BPE dropout is not supported", path);
    const char *opts[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t k = 0; k < 2; k++) {
        const char *v = json_string_value(json_object_get(model, opts[k]));
        if (v && v[0])
            return TM_ERR(err, TM_E_PARSE, "%s: model.%s is not supported", path, opts[k]);
    }
    tok->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));

    // pass 1: id range and arena size
    size_t arena_len = 0, i;
    int64_t max_id = -1;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)vocab, key, v) {
        int64_t id = json_id(v);
        if (id < 0)
            return TM_ERR(err, TM_E_PARSE, "%s: vocab entry \"%.100s\" has a bad id", path, key);
        max_id = TM_MAX(max_id, id);
        arena_len += strlen(key);
    }
    json_array_foreach(added, i, v) {
        int64_t id = json_id(json_object_get(v, "id"));
        const char *content = json_string_value(json_object_get(v, "content"));
        if (id < 0 || !content || !content[0])
            return TM_ERR(err, TM_E_PARSE, "%s: added_tokens[%zu] needs an id and a content", path,
                          i);
        const char *opts2[] = {"lstrip", "rstrip", "single_word"};
        for (size_t k = 0; k < 3; k++)
            if (!json_is_falsy(json_object_get(v, opts2[k])))
                return TM_ERR(err, TM_E_PARSE, "%s: added token %s: %s is not supported", path,
                              content, opts2[k]);
        max_id = TM_MAX(max_id, id);
        arena_len += strlen(content);
    }
    if (arena_len >= UINT32_MAX)
        return TM_ERR(err, TM_E_PARSE, "%s: vocabulary too large", path);
    tok->n_vocab = (uint32_t)max_id + 1;
    tok->arena = tm_malloc(arena_len + 1);
    tok->piece_off = tm_calloc(tok->n_vocab, sizeof(*tok->piece_off));
    tok->piece_len = tm_calloc(tok->n_vocab, sizeof(*tok->piece_len));
    tok->flags = tm_calloc(tok->n_vocab, sizeof(*tok->flags));
    tok->vmap_mask = pow2_at_least(2 * json_object_size(vocab)) - 1;
    tok->vmap = tm_calloc((size_t)tok->vmap_mask + 1, sizeof(*tok->vmap));
    if (!tok->arena || !tok->piece_off || !tok->piece_len || !tok->flags || !tok->vmap)
        return TM_ERR(err, TM_E_NOMEM, "%s: tokenizer tables for %u ids", path, tok->n_vocab);

    // pass 2: vocab pieces (raw bytes) and the piece -> id map
    build_cp_to_byte(tok->cp_byte);
    const int16_t *rev = tok->cp_byte;
    size_t at = 0, cap_unclean = 0;
    json_object_foreach((json_t *)vocab, key, v) {
        uint32_t id = (uint32_t)json_id(v);
        if (tok->flags[id] & TOKF_PRESENT)
            return TM_ERR(err, TM_E_PARSE, "%s: vocab id %u is used twice", path, id);
        size_t n = strlen(key), len = bytelevel_decode(rev, key, n, tok->arena + at);
        tok->flags[id] = TOKF_PRESENT;
        tok->piece_off[id] = (uint32_t)at;
        if (len == (size_t)-1) { // not byte-level text: HF's decoder emits the string itself
            memcpy(tok->arena + at, key, n);
            tok->piece_len[id] = (uint32_t)n;
            at += n;
            if (tok->n_unclean == cap_unclean) {
                cap_unclean = cap_unclean ? 2 * cap_unclean : 16;
                uint32_t *p = tm_realloc(tok->unclean, cap_unclean * sizeof(*p));
                if (!p)
                    return TM_ERR(err, TM_E_NOMEM, "%s: vocab", path);
                tok->unclean = p;
            }
            tok->unclean[tok->n_unclean++] = id;
            continue;
        }
        tok->piece_len[id] = (uint32_t)len;
        at += len;
        map_put(tok, tok->vmap, tok->vmap_mask, id);
    }
    for (uint32_t b = 0; b < 256; b++) {
        char c = (char)b;
        int32_t id = map_find(tok, tok->vmap, tok->vmap_mask, &c, 1);
        if (id < 0)
            return TM_ERR(err, TM_E_PARSE,
                          "%s: vocab has no token for byte 0x%02x (not a "
                          "byte-level BPE vocabulary?)",
                          path, b);
        tok->byte_id[b] = (uint32_t)id;
    }

    // added tokens: matched in the raw text; their piece is their content
    size_t n_added = json_array_size(added);
    tok->amap_mask = pow2_at_least(2 * n_added) - 1;
    tok->amap = tm_calloc((size_t)tok->amap_mask + 1, sizeof(*tok->amap));
    if (!tok->amap)
        return TM_ERR(err, TM_E_NOMEM, "%s: added token map", path);
    int too_many_lens = 0;
    json_array_foreach(added, i, v) {
        uint32_t id = (uint32_t)json_id(json_object_get(v, "id"));
        const char *content = json_string_value(json_object_get(v, "content"));
        size_t n = strlen(content);
        memcpy(tok->arena + at, content, n);
        tok->piece_off[id] = (uint32_t)at;
        tok->piece_len[id] = (uint32_t)n;
        at += n;
        tok->flags[id] |= TOKF_PRESENT | TOKF_ADDED;
        if (json_is_true(json_object_get(v, "special")))
            tok->flags[id] |= TOKF_SPECIAL;
        map_put(tok, tok->amap, tok->amap_mask, id);
        tok->added_first[(uint8_t)content[0]] = 1;
        tok->added_max_len = TM_MAX(tok->added_max_len, (uint32_t)n);
        uint32_t k = 0;
        while (k < tok->n_added_lens && tok->added_lens[k] > n)
            k++;
        if (k < tok->n_added_lens && tok->added_lens[k] == n)
            continue;
        if (tok->n_added_lens == 64) {
            too_many_lens = 1;
            continue;
        }
        memmove(tok->added_lens + k + 1, tok->added_lens + k,
                (tok->n_added_lens - k) * sizeof(tok->added_lens[0]));
        tok->added_lens[k] = (uint32_t)n;
        tok->n_added_lens++;
    }
    if (too_many_lens)
        tok->n_added_lens = 0; // match_added then tries every length up to added_max_len

    // merges: (left id, right id) -> (rank, merged id)
    size_t n_merges = json_array_size(merges);
    tok->mmap_mask = pow2_at_least(2 * n_merges) - 1;
    tok->mmap = tm_calloc((size_t)tok->mmap_mask + 1, sizeof(*tok->mmap));
    if (!tok->mmap)
        return TM_ERR(err, TM_E_NOMEM, "%s: %zu merges", path, n_merges);
    char cat[1024];
    json_array_foreach(merges, i, v) {
        const char *a = NULL, *b = NULL;
        size_t la = 0, lb = 0;
        if (json_is_string(v)) {
            a = json_string_value(v);
            const char *sp = strchr(a, ' ');
            if (sp && !strchr(sp + 1, ' ')) {
                la = (size_t)(sp - a);
                b = sp + 1;
                lb = strlen(b);
            }
        } else if (json_is_array(v) && json_array_size(v) == 2) {
            a = json_string_value(json_array_get(v, 0));
            b = json_string_value(json_array_get(v, 1));
            la = a ? strlen(a) : 0;
            lb = b ? strlen(b) : 0;
        }
        if (!a || !b || la == 0 || lb == 0 || la + lb >= sizeof(cat))
            return TM_ERR(err, TM_E_PARSE, "%s: merges[%zu] is not \"a b\" or [a, b]", path, i);
        memcpy(cat, a, la);
        cat[la] = '\0';
        int64_t ia = json_id(json_object_get(vocab, cat));
        int64_t ib = json_id(json_object_get(vocab, b));
        memcpy(cat + la, b, lb);
        cat[la + lb] = '\0';
        int64_t im = json_id(json_object_get(vocab, cat));
        if (ia < 0 || ib < 0 || im < 0)
            return TM_ERR(err, TM_E_PARSE, "%s: merges[%zu] (\"%.100s\"): %s is not in the vocab",
                          path, i, cat,
                          ia < 0   ? "left part"
                          : ib < 0 ? "right part"
                                   : "result");
        merge_put(tok, (uint32_t)ia, (uint32_t)ib, (uint32_t)i, (uint32_t)im);
    }

    tok->max_piece = 1;
    for (uint32_t id = 0; id < tok->n_vocab; id++)
        tok->max_piece = TM_MAX(tok->max_piece, tok->piece_len[id]);

    // pre-tokenizer, normalizer, decoder
    int saw_bytelevel = 0;
    const json_t *pt = json_object_get(root, "pre_tokenizer");
    if (pt && !json_is_null(pt)) {
        tm_rc rc = parse_pretok(tok, pt, &saw_bytelevel, path, err);
        if (rc)
            return rc;
    }
    if (!saw_bytelevel)
        return TM_ERR(err, TM_E_PARSE,
                      "%s: pre_tokenizer has no ByteLevel step (only byte-level "
                      "BPE tokenizers are supported)",
                      path);
    tm_rc rc = parse_normalizer(json_object_get(root, "normalizer"), path, err);
    if (rc)
        return rc;
    const json_t *dec = json_object_get(root, "decoder");
    if (dec && !json_is_null(dec) && strcmp(json_type_str(dec), "ByteLevel") != 0)
        return TM_ERR(err, TM_E_PARSE, "%s: decoder %s is not supported (only ByteLevel)", path,
                      json_type_str(dec));
    return TM_OK;
}

/* bos_token / eos_token: a string or an AddedToken object {"content": ...}; "" if absent. */
static tm_rc config_token(const json_t *cfg, const char *name, char **out, const char *path,
                          tm_err *err) {
    const json_t *v = json_object_get(cfg, name);
    if (json_is_object(v))
        v = json_object_get(v, "content");
    const char *s = json_string_value(v);
    if (!s && v && !json_is_null(v))
        return TM_ERR(err, TM_E_PARSE, "%s: %s is neither a string nor {content: ...}", path, name);
    *out = tm_strdup(s ? s : "");
    if (!*out)
        return TM_ERR(err, TM_E_NOMEM, "%s: %s", path, name);
    return TM_OK;
}

static tm_rc parse_config(tm_tokenizer *tok, const json_t *cfg, const char *path, tm_err *err) {
    tm_rc rc = config_token(cfg, "bos_token", &tok->bos_text, path, err);
    if (rc)
        return rc;
    rc = config_token(cfg, "eos_token", &tok->eos_text, path, err);
    if (rc)
        return rc;
    const json_t *ct = json_object_get(cfg, "chat_template");
    const char *tmpl = json_string_value(ct);
    if (json_is_array(ct)) { // [{name, template}, ...]: the one named "default"
        size_t i;
        const json_t *v;
        json_array_foreach(ct, i, v) {
            const char *name = json_string_value(json_object_get(v, "name"));
            if (name && strcmp(name, "default") == 0)
                tmpl = json_string_value(json_object_get(v, "template"));
        }
    }
    if (tmpl) {
        tok->chat_template = tm_strdup(tmpl);
        if (!tok->chat_template)
            return TM_ERR(err, TM_E_NOMEM, "%s: chat_template", path);
    }
    return TM_OK;
}

/* A new tokenizer from the parsed tokenizer.json (borrowed). On error *out stays NULL. */
static tm_rc load_model(const json_t *root, const char *path, tm_tokenizer **out, tm_err *err) {
    tm_tokenizer *tok = tm_calloc(1, sizeof(*tok));
    if (!tok)
        return TM_ERR(err, TM_E_NOMEM, "tokenizer");
    tok->bos_id = tok->eos_id = -1;
    tm_rc rc;
    if (!json_is_object(root))
        rc = TM_ERR(err, TM_E_PARSE, "%s: not a JSON object", path);
    else
        rc = parse_model(tok, root, path, err);
    if (rc) {
        tm_tok_destroy(tok);
        return rc;
    }
    *out = tok;
    return TM_OK;
}

/* Apply tokenizer_config.json (cfg borrowed, may be NULL): bos/eos and the chat template. */
static tm_rc load_config(tm_tokenizer *tok, const json_t *cfg, const char *path, tm_err *err) {
    tm_rc rc = parse_config(tok, cfg, path, err);
    if (rc)
        return rc;
    if (tok->bos_text[0]) {
        tok->bos_id = tm_tok_find(tok, tok->bos_text);
        if (tok->bos_id < 0)
            return TM_ERR(err, TM_E_PARSE, "%s: bos_token %s is not a token", path, tok->bos_text);
    }
    if (tok->eos_text[0]) {
        tok->eos_id = tm_tok_find(tok, tok->eos_text);
        if (tok->eos_id < 0)
            return TM_ERR(err, TM_E_PARSE, "%s: eos_token %s is not a token", path, tok->eos_text);
    }
    return TM_OK;
}

tm_rc tm_tok_load(const char *model_dir, tm_tokenizer **out, tm_err *err) {
    char path[4096];
    json_t *root = NULL, *cfg = NULL;
    tm_tokenizer *tok = NULL;
    *out = NULL;
    snprintf(path, sizeof(path), "%s/tokenizer.json", model_dir);
    tm_rc rc = load_json(path, 0, &root, err);
    if (rc)
        goto fail;
    rc = load_model(root, path, &tok, err);
    if (rc)
        goto fail;
    json_decref(root); // the vocabulary tree is large: free it before the next file
    root = NULL;
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", model_dir);
    rc = load_json(path, 1, &cfg, err);
    if (rc)
        goto fail;
    rc = load_config(tok, cfg, path, err);
    if (rc)
        goto fail;
    json_decref(cfg);
    *out = tok;
    return TM_OK;
fail:
    json_decref(root);
    json_decref(cfg);
    tm_tok_destroy(tok);
    return rc;
}

tm_rc tm_tok_load_mem(const char *json, size_t n_json, const char *config, size_t n_config,
                      const char *label, tm_tokenizer **out, tm_err *err) {
    char path[512];
    json_t *root = NULL, *cfg = NULL;
    tm_tokenizer *tok = NULL;
    *out = NULL;
    snprintf(path, sizeof(path), "%s/tokenizer.json", label);
    tm_rc rc = parse_json(json, n_json, path, &root, err);
    if (rc)
        goto fail;
    rc = load_model(root, path, &tok, err);
    if (rc)
        goto fail;
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", label);
    if (config) {
        rc = parse_json(config, n_config, path, &cfg, err);
        if (rc)
            goto fail;
    }
    rc = load_config(tok, cfg, path, err);
    if (rc)
        goto fail;
    json_decref(root);
    json_decref(cfg);
    *out = tok;
    return TM_OK;
fail:
    json_decref(root);
    json_decref(cfg);
    tm_tok_destroy(tok);
    return rc;
}
