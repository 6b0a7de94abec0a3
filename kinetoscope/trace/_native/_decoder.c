/* Native decoder of one chunk of the traceEvents array -> Arrow column buffers.
 *
 * Input: the bytes "[" event ("," event)* "]" [trailing top-level text] (the splitter's chunk,
 * see kinetoscope/trace/decode.py). Output: per table, columns that implement the Arrow
 * PyCapsule interface (__arrow_c_array__), so Polars imports them without a Python object per
 * event (numeric buffers are shared, not copied).
 *
 * Contract: the decoder either produces exactly what the Python loader would (the reference
 * rules of kinetoscope/trace/reference.py) or gives up ("fallback": returns None) and the
 * Python path decodes the chunk and decides (including every error and warning). It gives up
 * on anything unusual: a syntax error, truncation, invalid UTF-8 anywhere, escapes in keys, a
 * value of an odd type in a field the tables use, an integer outside int64, a timestamp that is
 * out of range, duplicate keys, deep nesting, CUPTI profiler ranges. Every read is bounds
 * checked against the end of the buffer; the parse runs without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ Arrow C data interface */
struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};
struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};
#define ARROW_FLAG_NULLABLE 2

/* ------------------------------------------------------------------ growable columns */
enum { C_I64 = 0, C_F64 = 1, C_STR = 2 };

typedef struct {
    int kind;
    int64_t n, cap;      /* rows */
    void *data;          /* int64/double values, or int64 offsets (n + 1) for strings */
    uint8_t *valid;      /* validity bitmap (LSB first), cap bits */
    int64_t nulls;
    char *sdata;         /* string bytes */
    int64_t slen, scap;
    int64_t hint;        /* rows to allocate at first (an estimate from the chunk's size) */
    const void *bufs[3]; /* export */
} Col;

static Col *col_new(int kind) {
    Col *c = (Col *)calloc(1, sizeof(Col));
    if (!c) return NULL;
    c->kind = kind;
    return c;
}

static void col_free(Col *c) {
    if (!c) return;
    free(c->data);
    free(c->valid);
    free(c->sdata);
    free(c);
}

static int col_grow(Col *c, int64_t need) {
    if (need <= c->cap) return 1;
    int64_t cap = c->cap ? c->cap : (c->hint > 256 ? c->hint : 256);
    while (cap < need) cap *= 2;
    size_t es = 8;
    size_t extra = c->kind == C_STR ? 1 : 0;
    void *d = realloc(c->data, (size_t)(cap + (int64_t)extra) * es);
    if (!d) return 0;
    c->data = d;
    if (c->kind == C_STR && c->cap == 0) ((int64_t *)d)[0] = 0;
    uint8_t *v = (uint8_t *)realloc(c->valid, (size_t)(cap + 7) / 8);
    if (!v) return 0;
    memset(v + (c->cap + 7) / 8, 0, (size_t)((cap + 7) / 8 - (c->cap + 7) / 8));
    c->valid = v;
    c->cap = cap;
    return 1;
}

static int sgrow(Col *c, int64_t more) {
    if (c->sdata && c->slen + more <= c->scap) return 1; /* (never NULL after: memcpy's rules) */
    int64_t cap = c->scap ? c->scap : (c->hint * 16 > 4096 ? c->hint * 16 : 4096);
    while (cap < c->slen + more) cap *= 2;
    char *s = (char *)realloc(c->sdata, (size_t)cap);
    if (!s) return 0;
    c->sdata = s;
    c->scap = cap;
    return 1;
}

/* Give back the spare capacity before Polars adopts the buffers (numeric columns are shared,
   not copied: their slack would stay allocated as long as the table lives). */
static void col_shrink(Col *c) {
    int64_t rows = c->n > 0 ? c->n : 1;
    if (rows < c->cap) {
        void *d = realloc(c->data, (size_t)(rows + (c->kind == C_STR ? 1 : 0)) * 8);
        if (d) c->data = d;
        uint8_t *v = (uint8_t *)realloc(c->valid, (size_t)(rows + 7) / 8);
        if (v) c->valid = v;
        c->cap = rows;
    }
    if (c->kind == C_STR && c->slen > 0 && c->slen < c->scap) {
        char *sd = (char *)realloc(c->sdata, (size_t)c->slen);
        if (sd) {
            c->sdata = sd;
            c->scap = c->slen;
        }
    }
}

static inline void setvalid(Col *c, int64_t i) { c->valid[i >> 3] |= (uint8_t)(1u << (i & 7)); }

static int col_null(Col *c) {
    if (!col_grow(c, c->n + 1)) return 0;
    if (c->kind == C_STR)
        ((int64_t *)c->data)[c->n + 1] = c->slen;
    else if (c->kind == C_I64)
        ((int64_t *)c->data)[c->n] = 0;
    else
        ((double *)c->data)[c->n] = 0.0;
    c->nulls++;
    c->n++;
    return 1;
}

static int col_i64(Col *c, int64_t v) {
    if (!col_grow(c, c->n + 1)) return 0;
    ((int64_t *)c->data)[c->n] = v;
    setvalid(c, c->n);
    c->n++;
    return 1;
}

static int col_f64(Col *c, double v) {
    if (!col_grow(c, c->n + 1)) return 0;
    ((double *)c->data)[c->n] = v;
    setvalid(c, c->n);
    c->n++;
    return 1;
}

/* finish a string row whose bytes were appended to sdata */
static int col_str_done(Col *c) {
    if (!col_grow(c, c->n + 1)) return 0;
    ((int64_t *)c->data)[c->n + 1] = c->slen;
    setvalid(c, c->n);
    c->n++;
    return 1;
}

static int col_str(Col *c, const char *s, int64_t len) {
    if (!sgrow(c, len)) return 0;
    memcpy(c->sdata + c->slen, s, (size_t)len);
    c->slen += len;
    return col_str_done(c);
}

/* ------------------------------------------------------------------ JSON scanning */
typedef struct {
    const uint8_t *p, *end;
} Scan;

enum { V_NONE = 0, V_STR, V_INT, V_FLOAT, V_TRUE, V_FALSE, V_NULL, V_ARR, V_OBJ };

typedef struct {
    int type;
    int esc; /* string: holds a backslash escape */
    const uint8_t *s, *e; /* string: inside the quotes; others: the value's text */
} Val;

#define MAX_DEPTH 64

static inline void skip_ws(Scan *sc) {
    const uint8_t *p = sc->p, *e = sc->end;
    while (p < e && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    sc->p = p;
}

static inline int hexval(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A valid UTF-8 sequence at p (lead byte >= 0x80) ending before e: its length, else 0. */
static int utf8_len(const uint8_t *p, const uint8_t *e) {
    uint8_t c = p[0];
    int n;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) { n = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; cp = c & 0x07; }
    else return 0;
    if (e - p < n) return 0;
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if (n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
    if (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
    return n;
}

/* sc->p at '"': validate the string (UTF-8, escapes, no raw control characters). */
static int scan_string(Scan *sc, Val *v) {
    const uint8_t *p = sc->p + 1, *e = sc->end;
    v->type = V_STR;
    v->esc = 0;
    v->s = p;
    while (1) {
        /* 8 bytes at a time while none is '"', '\\', a control character or non-ASCII */
        while (e - p >= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
            uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
            uint64_t special = ((q - ones) & ~q) | ((b - ones) & ~b) | ((w - ones * 0x20) & ~w) | w;
            if (special & high) break;
            p += 8;
        }
        while (p < e && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\') p++;
        if (p >= e) return 0;
        uint8_t c = *p;
        if (c == '"') break;
        if (c < 0x20) return 0;
        if (c == '\\') {
            v->esc = 1;
            if (e - p < 2) return 0;
            uint8_t x = p[1];
            if (x == 'u') {
                if (e - p < 6) return 0;
                for (int i = 2; i < 6; i++)
                    if (hexval(p[i]) < 0) return 0;
                p += 6;
            } else if (x == '"' || x == '\\' || x == '/' || x == 'b' || x == 'f' || x == 'n' || x == 'r' || x == 't') {
                p += 2;
            } else {
                return 0;
            }
            continue;
        }
        int n = utf8_len(p, e);
        if (!n) return 0;
        p += n;
    }
    v->e = p;
    sc->p = p + 1;
    return 1;
}

/* JSON number grammar; V_INT or V_FLOAT. */
static int scan_number(Scan *sc, Val *v) {
    const uint8_t *p = sc->p, *e = sc->end;
    v->s = p;
    int isint = 1;
    if (p < e && *p == '-') p++;
    if (p >= e) return 0;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < e && *p >= '0' && *p <= '9') p++;
    } else {
        return 0;
    }
    if (p < e && *p == '.') {
        isint = 0;
        p++;
        if (p >= e || !(*p >= '0' && *p <= '9')) return 0;
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        isint = 0;
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (p >= e || !(*p >= '0' && *p <= '9')) return 0;
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    /* a number must be followed by a delimiter (or the end of the data, which the caller
       then reports as truncated) */
    v->e = p;
    v->type = isint ? V_INT : V_FLOAT;
    sc->p = p;
    return 1;
}

static int scan_value(Scan *sc, Val *v, int depth);

static int scan_container(Scan *sc, Val *v, int depth) {
    uint8_t open = *sc->p;
    uint8_t close = open == '[' ? ']' : '}';
    if (depth >= MAX_DEPTH) return 0;
    v->type = open == '[' ? V_ARR : V_OBJ;
    v->s = sc->p;
    sc->p++;
    skip_ws(sc);
    if (sc->p >= sc->end) return 0;
    if (*sc->p == close) {
        sc->p++;
        v->e = sc->p;
        return 1;
    }
    while (1) {
        Val item;
        if (open == '{') {
            if (sc->p >= sc->end || *sc->p != '"') return 0;
            if (!scan_string(sc, &item)) return 0;
            skip_ws(sc);
            if (sc->p >= sc->end || *sc->p != ':') return 0;
            sc->p++;
            skip_ws(sc);
        }
        if (!scan_value(sc, &item, depth + 1)) return 0;
        skip_ws(sc);
        if (sc->p >= sc->end) return 0;
        if (*sc->p == ',') {
            sc->p++;
            skip_ws(sc);
            continue;
        }
        if (*sc->p == close) {
            sc->p++;
            v->e = sc->p;
            return 1;
        }
        return 0;
    }
}

static int lit(Scan *sc, const char *word, int n) {
    if (sc->end - sc->p < n || memcmp(sc->p, word, (size_t)n) != 0) return 0;
    sc->p += n;
    return 1;
}

static int scan_value(Scan *sc, Val *v, int depth) {
    if (sc->p >= sc->end) return 0;
    uint8_t c = *sc->p;
    v->s = sc->p;
    v->esc = 0;
    switch (c) {
    case '"': return scan_string(sc, v);
    case '{':
    case '[': return scan_container(sc, v, depth);
    case 't': v->type = V_TRUE; if (!lit(sc, "true", 4)) return 0; v->e = sc->p; return 1;
    case 'f': v->type = V_FALSE; if (!lit(sc, "false", 5)) return 0; v->e = sc->p; return 1;
    case 'n': v->type = V_NULL; if (!lit(sc, "null", 4)) return 0; v->e = sc->p; return 1;
    default: return scan_number(sc, v);
    }
}

/* ------------------------------------------------------------------ value conversions */
/* Integer text (JSON int grammar, already checked) -> int64; 0 when outside int64. */
static int int_value(const Val *v, int64_t *out) {
    const uint8_t *p = v->s, *e = v->e;
    int neg = 0;
    if (p < e && *p == '-') { neg = 1; p++; }
    if (e - p > 19) return 0;
    uint64_t acc = 0;
    for (; p < e; p++) {
        uint64_t d = (uint64_t)(*p - '0');
        if (acc > (UINT64_MAX - d) / 10) return 0;
        acc = acc * 10 + d;
    }
    if (neg) {
        if (acc > (uint64_t)INT64_MAX + 1) return 0;
        *out = acc == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)acc;
    } else {
        if (acc > (uint64_t)INT64_MAX) return 0;
        *out = (int64_t)acc;
    }
    return 1;
}

/* |ns| <= this: int64 max rounded down to a whole microsecond (reference.TS_LIMIT_NS) */
#define TS_LIMIT_NS 9223372036854775000ULL
#define MAX_DIGITS 64

/* Microseconds (JSON number text) -> exact int64 ns, value * 1000 rounded half to even
   (reference.exact_ns_text). 0 when out of range or too long to judge here. */
static int ns_value(const Val *v, int64_t *out) {
    const uint8_t *p = v->s, *e = v->e;
    int neg = 0;
    char dig[MAX_DIGITS];
    int nd = 0, nfrac = 0;
    long exp = 0;
    if (p < e && *p == '-') { neg = 1; p++; }
    int leading = 1;
    for (; p < e && *p >= '0' && *p <= '9'; p++) {
        if (leading && *p == '0') continue;
        leading = 0;
        if (nd >= MAX_DIGITS) return 0;
        dig[nd++] = (char)(*p - '0');
    }
    if (p < e && *p == '.') {
        p++;
        for (; p < e && *p >= '0' && *p <= '9'; p++) {
            nfrac++;
            if (leading && *p == '0') continue;
            leading = 0;
            if (nd >= MAX_DIGITS) return 0;
            dig[nd++] = (char)(*p - '0');
        }
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        p++;
        int eneg = 0;
        if (p < e && (*p == '+' || *p == '-')) { eneg = *p == '-'; p++; }
        for (; p < e; p++) {
            exp = exp * 10 + (*p - '0');
            if (exp > 100000) return 0;
        }
        if (eneg) exp = -exp;
    }
    if (nd == 0) { *out = 0; return 1; }
    long sc = exp - nfrac + 3; /* ns = digits * 10**sc */
    uint64_t q = 0;
    if (sc >= 0) {
        if (nd + sc > 19) return 0;
        for (int i = 0; i < nd; i++) q = q * 10 + (uint64_t)dig[i];
        for (long i = 0; i < sc; i++) q *= 10;
    } else {
        long k = -sc; /* digits dropped */
        if (nd < k) {
            q = 0; /* |value * 1000| < 0.1 */
        } else {
            long nq = nd - k;
            if (nq > 19) return 0;
            for (long i = 0; i < nq; i++) q = q * 10 + (uint64_t)dig[i];
            /* remainder dig[nq:] against half = 5 followed by zeros */
            int cmp;
            if (dig[nq] > 5) cmp = 1;
            else if (dig[nq] < 5) cmp = -1;
            else {
                cmp = 0;
                for (long i = nq + 1; i < nd; i++)
                    if (dig[i]) { cmp = 1; break; }
            }
            if (cmp > 0 || (cmp == 0 && (q & 1))) q++;
        }
    }
    if (q > TS_LIMIT_NS) return 0;
    *out = neg ? -(int64_t)q : (int64_t)q;
    return 1;
}

/* Number text -> double, correctly rounded like Python's float(): glibc's strtod is exact (and
   the "C" locale fixes the decimal point); it runs without the GIL, which CPython's own
   PyOS_string_to_double needs (its big-number allocator is shared). Elsewhere the parse keeps
   the GIL (KS_KEEP_GIL) and uses Python's conversion. */
#if defined(__GLIBC__)
#include <locale.h>
static locale_t g_c_locale = (locale_t)0;
#define KS_STRTOD(s, endp) strtod_l((s), (endp), g_c_locale)
#else
#define KS_KEEP_GIL 1
#define KS_STRTOD(s, endp) PyOS_string_to_double((s), (endp), NULL)
#endif

static int float_value(const Val *v, double *out) {
    char tmp[80];
    size_t n = (size_t)(v->e - v->s);
    if (n >= sizeof(tmp)) return 0;
    memcpy(tmp, v->s, n);
    tmp[n] = 0;
    char *endp = NULL;
    double d = KS_STRTOD(tmp, &endp);
    if (endp != tmp + n) return 0;
    if (isinf(d) || isnan(d)) return 0;
    *out = d;
    return 1;
}

/* Unescape string v into c->sdata (appending). 0 for a lone surrogate. */
static int append_unescaped(Col *c, const Val *v) {
    int64_t raw = v->e - v->s;
    if (!sgrow(c, raw)) return 0;
    if (!v->esc) {
        memcpy(c->sdata + c->slen, v->s, (size_t)raw);
        c->slen += raw;
        return 1;
    }
    const uint8_t *p = v->s, *e = v->e;
    char *o = c->sdata + c->slen;
    while (p < e) {
        if (*p != '\\') { *o++ = (char)*p++; continue; }
        uint8_t x = p[1];
        p += 2;
        switch (x) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        default: { /* 'u' (checked by scan_string) */
            uint32_t cp = (uint32_t)((hexval(p[0]) << 12) | (hexval(p[1]) << 8) | (hexval(p[2]) << 4) | hexval(p[3]));
            p += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return 0;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (e - p < 6 || p[0] != '\\' || p[1] != 'u') return 0;
                uint32_t lo = (uint32_t)((hexval(p[2]) << 12) | (hexval(p[3]) << 8) | (hexval(p[4]) << 4) | hexval(p[5]));
                if (lo < 0xDC00 || lo > 0xDFFF) return 0;
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            /* the 6 (or 12) escape bytes always hold the 1-4 UTF-8 bytes */
            if (cp < 0x80) *o++ = (char)cp;
            else if (cp < 0x800) { *o++ = (char)(0xC0 | (cp >> 6)); *o++ = (char)(0x80 | (cp & 0x3F)); }
            else if (cp < 0x10000) {
                *o++ = (char)(0xE0 | (cp >> 12)); *o++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *o++ = (char)(0x80 | (cp & 0x3F));
            } else {
                *o++ = (char)(0xF0 | (cp >> 18)); *o++ = (char)(0x80 | ((cp >> 12) & 0x3F));
                *o++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *o++ = (char)(0x80 | (cp & 0x3F));
            }
        }
        }
    }
    c->slen = o - c->sdata;
    return 1;
}

/* A string value (or null) -> string column. */
static int put_opt_str(Col *c, const Val *v) {
    if (v->type == V_NONE || v->type == V_NULL) return col_null(c);
    if (v->type != V_STR) return 0;
    if (!append_unescaped(c, v)) return 0;
    return col_str_done(c);
}

/* An integer (or null / absent) -> int64 column. */
static int put_opt_int(Col *c, const Val *v) {
    int64_t x;
    if (v->type == V_NONE || v->type == V_NULL) return col_null(c);
    if (v->type != V_INT || !int_value(v, &x)) return 0;
    return col_i64(c, x);
}

/* Compact JSON text of an array as msgspec.json.encode writes it, for the forms where the
   source text already is that (strings with only \" \\ \n \r \t \b \f escapes, canonical
   integers, true/false/null, nested arrays); anything else gives up. */
static int append_compact(Col *c, const uint8_t *s, const uint8_t *e) {
    if (!sgrow(c, e - s)) return 0;
    char *o = c->sdata + c->slen;
    const uint8_t *p = s;
    while (p < e) {
        uint8_t ch = *p;
        if (ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t') { p++; continue; }
        if (ch == '"') {
            const uint8_t *q = p + 1;
            while (q < e && *q != '"') {
                if (*q == '\\') {
                    uint8_t x = q[1];
                    if (!(x == '"' || x == '\\' || x == 'n' || x == 'r' || x == 't' || x == 'b' || x == 'f')) return 0;
                    q += 2;
                } else {
                    q++;
                }
            }
            q++; /* closing quote (validated by the scan) */
            memcpy(o, p, (size_t)(q - p));
            o += q - p;
            p = q;
            continue;
        }
        if (ch == '{' || ch == '.' || ch == 'e' || ch == 'E') return 0; /* objects, floats */
        if (ch == '-') {
            if (p + 1 < e && p[1] == '0') return 0; /* -0 (becomes 0) or -0.x */
        }
        if (ch >= '0' && ch <= '9') {
            const uint8_t *q = p;
            while (q < e && *q >= '0' && *q <= '9') q++;
            if (q - p > 18) return 0; /* maybe beyond int64: let Python judge */
            if (q < e && (*q == '.' || *q == 'e' || *q == 'E')) return 0;
            memcpy(o, p, (size_t)(q - p));
            o += q - p;
            p = q;
            continue;
        }
        *o++ = (char)ch;
        p++;
    }
    c->slen = o - c->sdata;
    return 1;
}

/* reference.coerce_int for an args value: 1 (an int64 in *out), 0 (null: not usable), -1
   (give up: out of int64, which Python counts in a warning, or a form only Python judges). */
static int coerce_int(const Val *v, int64_t *out) {
    switch (v->type) {
    case V_INT: return int_value(v, out) ? 1 : -1;
    case V_TRUE: *out = 1; return 1;
    case V_FALSE: *out = 0; return 1;
    case V_NULL:
    case V_ARR:
    case V_OBJ: return 0;
    case V_FLOAT: {
        double d;
        if (!float_value(v, &d)) return -1;
        if (!(d > -9.2e18 && d < 9.2e18)) return -1;
        *out = (int64_t)d; /* truncation toward zero, as int(float) */
        return 1;
    }
    case V_STR: {
        /* _INT_RE: \s*[-+]?[0-9]+\s*\Z; non-ASCII (Unicode spaces) and escapes: Python */
        const uint8_t *p = v->s, *e = v->e;
        if (v->esc) return -1;
        for (const uint8_t *q = p; q < e; q++)
            if (*q >= 0x80) return -1;
        while (p < e && (*p == ' ' || (*p >= '\t' && *p <= '\r'))) p++;
        int neg = 0;
        if (p < e && (*p == '-' || *p == '+')) { neg = *p == '-'; p++; }
        const uint8_t *d0 = p;
        while (p < e && *p == '0') p++; /* leading zeros ("007" is 7) */
        const uint8_t *d1 = p;
        while (p < e && *p >= '0' && *p <= '9') p++;
        const uint8_t *d2 = p;
        if (d2 == d0) return 0;
        while (p < e && (*p == ' ' || (*p >= '\t' && *p <= '\r'))) p++;
        if (p != e) return 0;
        if (d2 - d1 > 18) return -1;
        int64_t x = 0;
        for (const uint8_t *q = d1; q < d2; q++) x = x * 10 + (*q - '0');
        *out = neg ? -x : x;
        return 1;
    }
    default: return -1;
    }
}

/* reference.coerce_float for an args value (strings: Python's float() rules). */
static int coerce_float(const Val *v, double *out) {
    switch (v->type) {
    case V_INT:
    case V_FLOAT: return float_value(v, out) ? 1 : -1;
    case V_TRUE: *out = 1.0; return 1;
    case V_FALSE: *out = 0.0; return 1;
    case V_NULL:
    case V_ARR:
    case V_OBJ: return 0;
    default: return -1;
    }
}

/* A value of an args key that feeds a string column (reference.coerce_str). */
static int put_str_arg(Col *c, const Val *v) {
    switch (v->type) {
    case V_STR:
        if (!append_unescaped(c, v)) return 0;
        return col_str_done(c);
    case V_INT: {
        int64_t x;
        if (!int_value(v, &x)) return 0;
        if (v->e - v->s >= 2 && v->s[0] == '-' && v->s[1] == '0') return 0;
        return col_str(c, (const char *)v->s, v->e - v->s);
    }
    case V_TRUE: return col_str(c, "true", 4);
    case V_FALSE: return col_str(c, "false", 5);
    case V_ARR:
        if (!append_compact(c, v->s, v->e)) return 0;
        return col_str_done(c);
    default: return 0;
    }
}

/* ------------------------------------------------------------------ spec (from Python) */
#define MAX_ARG_KEYS 64
#define MAX_ARG_COLS 64
typedef struct {
    char *key;
    Py_ssize_t len;
    int col;  /* column index */
    int kind; /* C_I64 / C_F64 / C_STR */
} ArgKey;

static ArgKey g_keys[MAX_ARG_KEYS];
static int g_nkeys = 0;
static int g_ncols = 0;
static int g_colkind[MAX_ARG_COLS];
static int g_profiler_cat_len = 19; /* "cuda_profiler_range" */
static const char *g_profiler_cat = "cuda_profiler_range";

static const char *INSTANT_KEYS[6] = {"Device Type", "Device Id", "Addr", "Bytes", "Total Allocated", "Total Reserved"};

/* ------------------------------------------------------------------ tables */
enum { T_EVENTS = 0, T_FLOWS, T_INSTANTS, T_META, T_COUNTERS, N_TABLES };

/* core columns per table (args columns of events follow, created when first used) */
enum { E_IDX, E_CAT, E_NAME, E_PID, E_TID, E_TS, E_DUR, E_N };
enum { F_IDX, F_PH, F_CAT, F_NAME, F_ID, F_PID, F_TID, F_TS, F_BP, F_N };
enum { I_IDX, I_CAT, I_NAME, I_PID, I_TID, I_TS, I_SCOPE, I_A0, I_N = I_A0 + 6 };
enum { M_IDX, M_NAME, M_PID, M_TID, M_ANAME, M_ALABELS, M_ASORT, M_N };
enum { K_IDX, K_NAME, K_PID, K_TS, K_KEY, K_VALUE, K_N };

static const char *E_NAMES[E_N] = {"idx", "cat", "name", "pid", "tid", "ts", "dur"};
static const int E_KINDS[E_N] = {C_I64, C_STR, C_STR, C_I64, C_I64, C_I64, C_I64};
static const char *F_NAMES[F_N] = {"idx", "ph", "cat", "name", "id", "pid", "tid", "ts", "bp"};
static const int F_KINDS[F_N] = {C_I64, C_STR, C_STR, C_STR, C_I64, C_I64, C_I64, C_I64, C_STR};
static const char *I_NAMES[I_N] = {"idx", "cat", "name", "pid", "tid", "ts", "scope",
                                   "device_type", "device_id", "addr", "bytes", "total_allocated", "total_reserved"};
static const int I_KINDS[I_N] = {C_I64, C_STR, C_STR, C_I64, C_I64, C_I64, C_STR, C_I64, C_I64, C_I64, C_I64, C_I64, C_I64};
static const char *M_NAMES[M_N] = {"idx", "mname", "pid", "tid", "a_name", "a_labels", "a_sort_index"};
static const int M_KINDS[M_N] = {C_I64, C_STR, C_I64, C_I64, C_STR, C_STR, C_I64};
static const char *K_NAMES[K_N] = {"idx", "name", "pid", "ts", "key", "value"};
static const int K_KINDS[K_N] = {C_I64, C_STR, C_I64, C_I64, C_STR, C_F64};

#define MAX_LABELS 4096
typedef struct {
    const uint8_t *s; /* raw (unescaped: labels with escapes give up) */
    int64_t len;
} Label;

typedef struct {
    Col *t[N_TABLES][16];
    int64_t rows[N_TABLES];
    Col *args[MAX_ARG_COLS]; /* events args columns (NULL until first value) */
    Label labels[MAX_LABELS];
    int nlabels;
    int64_t n_events;
    int64_t hint;        /* complete events expected: the chunk's size / 256 bytes */
    int64_t end_rel;     /* where the top-level text continues (-1: at the end of the data) */
    const char *why;     /* why the decoder gave up */
    int64_t why_at;      /* byte offset of the event that made it give up */
} Out;

static void out_free(Out *o) {
    for (int t = 0; t < N_TABLES; t++)
        for (int i = 0; i < 16; i++) col_free(o->t[t][i]);
    for (int i = 0; i < MAX_ARG_COLS; i++) col_free(o->args[i]);
    free(o);
}

static int table_init(Out *o, int t, int n, const int *kinds) {
    for (int i = 0; i < n; i++) {
        o->t[t][i] = col_new(kinds[i]);
        if (!o->t[t][i]) return 0;
        if (t == T_EVENTS) o->t[t][i]->hint = o->hint;
    }
    return 1;
}

/* ------------------------------------------------------------------ events */
#define MAX_MEMBERS 96
typedef struct {
    Val key, val;
} Member;

typedef struct {
    Val ph, cat, name, pid, tid, ts, dur, args, id, bp, s;
    int nargs; /* members of an object "args" (-1: more than MAX_MEMBERS, not recorded) */
    Member am[MAX_MEMBERS];
} Ev;

/* sc->p at '{' of "args": validate it like scan_container, recording its members. */
static int scan_args(Scan *sc, Ev *ev) {
    Val *v = &ev->args;
    v->type = V_OBJ;
    v->esc = 0;
    v->s = sc->p;
    ev->nargs = 0;
    sc->p++;
    skip_ws(sc);
    if (sc->p >= sc->end) return 0;
    if (*sc->p == '}') {
        sc->p++;
        v->e = sc->p;
        return 1;
    }
    while (1) {
        Member m;
        if (sc->p >= sc->end || *sc->p != '"') return 0;
        if (!scan_string(sc, &m.key)) return 0;
        skip_ws(sc);
        if (sc->p >= sc->end || *sc->p != ':') return 0;
        sc->p++;
        skip_ws(sc);
        if (!scan_value(sc, &m.val, 2)) return 0;
        if (ev->nargs >= 0) {
            if (ev->nargs < MAX_MEMBERS) ev->am[ev->nargs++] = m;
            else ev->nargs = -1;
        }
        skip_ws(sc);
        if (sc->p >= sc->end) return 0;
        if (*sc->p == ',') { sc->p++; skip_ws(sc); continue; }
        if (*sc->p == '}') { sc->p++; v->e = sc->p; return 1; }
        return 0;
    }
}

static int is_int_text(const uint8_t *s, const uint8_t *e) {
    /* reference._INT_RE: \s*[-+]?[0-9]+\s*\Z (a superset check: give up if it may match) */
    const uint8_t *p = s;
    while (p < e && (*p == ' ' || (*p >= '\t' && *p <= '\r') || *p >= 0x80)) p++;
    if (p < e && (*p == '-' || *p == '+')) p++;
    const uint8_t *d = p;
    while (p < e && *p >= '0' && *p <= '9') p++;
    if (p == d) return 0;
    while (p < e && (*p == ' ' || (*p >= '\t' && *p <= '\r') || *p >= 0x80)) p++;
    return p == e;
}

/* pid/tid: register a label (pid then tid, in event order, as IdMap.register). */
static int reg_label(Out *o, const Val *v, int64_t *id, int *isnull) {
    *isnull = 0;
    if (v->type == V_NONE || v->type == V_NULL) { *isnull = 1; return 1; }
    if (v->type == V_INT) return int_value(v, id);
    if (v->type != V_STR || v->esc) return 0;
    if (is_int_text(v->s, v->e)) return 0;
    int64_t len = v->e - v->s;
    for (int i = 0; i < o->nlabels; i++) {
        if (o->labels[i].len == len && memcmp(o->labels[i].s, v->s, (size_t)len) == 0) {
            *id = -(int64_t)(i + 1);
            return 1;
        }
    }
    if (o->nlabels >= MAX_LABELS) return 0;
    o->labels[o->nlabels].s = v->s;
    o->labels[o->nlabels].len = len;
    o->nlabels++;
    *id = -(int64_t)o->nlabels;
    return 1;
}

static int put_id(Col *c, int64_t id, int isnull) { return isnull ? col_null(c) : col_i64(c, id); }

#define KEYIS(k, n, lit) ((n) == (int64_t)sizeof(lit) - 1 && memcmp((k), (lit), sizeof(lit) - 1) == 0)

/* sc->p at '{': scan one event object, remembering the fields the tables use. */
static int scan_event(Scan *sc, Ev *ev) {
    memset(ev, 0, offsetof(Ev, am));
    sc->p++;
    skip_ws(sc);
    if (sc->p >= sc->end) return 0;
    if (*sc->p == '}') { sc->p++; return 1; }
    while (1) {
        Val key, val;
        if (sc->p >= sc->end || *sc->p != '"') return 0;
        if (!scan_string(sc, &key)) return 0;
        skip_ws(sc);
        if (sc->p >= sc->end || *sc->p != ':') return 0;
        sc->p++;
        skip_ws(sc);
        if (key.esc) return 0;
        const uint8_t *k = key.s;
        int64_t n = key.e - key.s;
        if (n == 4 && memcmp(k, "args", 4) == 0 && sc->p < sc->end && *sc->p == '{') {
            if (ev->args.type != V_NONE) return 0; /* a duplicate key */
            if (!scan_args(sc, ev)) return 0;
            goto next;
        }
        if (!scan_value(sc, &val, 1)) return 0;
        Val *slot = NULL;
        switch (n) {
        case 1: if (k[0] == 's') slot = &ev->s; break;
        case 2:
            if (KEYIS(k, n, "ph")) slot = &ev->ph;
            else if (KEYIS(k, n, "ts")) slot = &ev->ts;
            else if (KEYIS(k, n, "id")) slot = &ev->id;
            else if (KEYIS(k, n, "bp")) slot = &ev->bp;
            break;
        case 3:
            if (KEYIS(k, n, "cat")) slot = &ev->cat;
            else if (KEYIS(k, n, "pid")) slot = &ev->pid;
            else if (KEYIS(k, n, "tid")) slot = &ev->tid;
            else if (KEYIS(k, n, "dur")) slot = &ev->dur;
            break;
        case 4:
            if (KEYIS(k, n, "name")) slot = &ev->name;
            else if (KEYIS(k, n, "args")) slot = &ev->args;
            break;
        default: break;
        }
        if (slot) {
            if (slot->type != V_NONE) return 0; /* a duplicate key: let Python judge */
            *slot = val;
        }
    next:
        skip_ws(sc);
        if (sc->p >= sc->end) return 0;
        if (*sc->p == ',') { sc->p++; skip_ws(sc); continue; }
        if (*sc->p == '}') { sc->p++; return 1; }
        return 0;
    }
}

/* Iterate the members of an object value (validated already). */
typedef struct {
    Scan sc;
    int first;
    const Ev *ev; /* recorded members of ev->args, when it is that object */
    int i;
} ObjIter;

static void obj_begin(ObjIter *it, const Val *obj, const Ev *ev) {
    it->sc.p = obj->s + 1;
    it->sc.end = obj->e;
    it->first = 1;
    it->ev = ev && obj == &ev->args && ev->nargs >= 0 ? ev : NULL;
    it->i = 0;
}

/* 1: a member (key, value); 0: the end; -1: give up */
static int obj_next(ObjIter *it, Val *key, Val *val) {
    if (it->ev) {
        if (it->i >= it->ev->nargs) return 0;
        *key = it->ev->am[it->i].key;
        *val = it->ev->am[it->i].val;
        it->i++;
        return 1;
    }
    Scan *sc = &it->sc;
    skip_ws(sc);
    if (!it->first) {
        if (sc->p < sc->end && *sc->p == ',') { sc->p++; skip_ws(sc); }
    }
    it->first = 0;
    if (sc->p >= sc->end || *sc->p == '}') return 0;
    if (!scan_string(sc, key)) return -1;
    skip_ws(sc);
    sc->p++; /* ':' */
    skip_ws(sc);
    if (!scan_value(sc, val, 1)) return -1;
    return 1;
}

static int x_args(Out *o, const Ev *ev, const Val *args, int64_t row) {
    Val vals[MAX_ARG_KEYS];
    for (int i = 0; i < g_nkeys; i++) vals[i].type = V_NONE;
    if (args->type == V_OBJ) {
        ObjIter it;
        Val key, val;
        int r;
        obj_begin(&it, args, ev);
        while ((r = obj_next(&it, &key, &val)) == 1) {
            if (key.esc) return 0;
            int64_t n = key.e - key.s;
            for (int i = 0; i < g_nkeys; i++) {
                if (g_keys[i].len == n && memcmp(g_keys[i].key, key.s, (size_t)n) == 0) {
                    if (vals[i].type != V_NONE) return 0; /* duplicate */
                    vals[i] = val;
                    break;
                }
            }
        }
        if (r < 0) return 0;
    } else if (args->type != V_NONE && args->type != V_NULL) {
        return 0;
    }
    /* per column: the first key (ARG_COLUMNS order) with a usable value */
    int done[MAX_ARG_COLS] = {0};
    for (int i = 0; i < g_nkeys; i++) {
        int col = g_keys[i].col;
        if (done[col] || vals[i].type == V_NONE || vals[i].type == V_NULL) continue;
        Col *c = o->args[col];
        if (!c) {
            c = o->args[col] = col_new(g_colkind[col]);
            if (!c) return 0;
            c->hint = o->hint;
            for (int64_t r = 0; r < row; r++)
                if (!col_null(c)) return 0;
        }
        int ok;
        if (g_keys[i].kind == C_I64) {
            int64_t x;
            int r = coerce_int(&vals[i], &x);
            if (r < 0) return 0;
            if (r == 0) continue; /* not usable: the next key of the column, if any */
            ok = col_i64(c, x);
        } else if (g_keys[i].kind == C_F64) {
            double d;
            int r = coerce_float(&vals[i], &d);
            if (r < 0) return 0;
            if (r == 0) continue;
            ok = col_f64(c, d);
        } else {
            ok = put_str_arg(c, &vals[i]);
        }
        if (!ok) return 0;
        done[col] = 1;
    }
    for (int col = 0; col < g_ncols; col++)
        if (!done[col] && o->args[col] && !col_null(o->args[col])) return 0;
    return 1;
}

static int ts_or_zero(const Val *v, int64_t *ns) {
    if (v->type == V_NONE) { *ns = 0; return 1; }
    if (v->type != V_INT && v->type != V_FLOAT) return 0;
    return ns_value(v, ns);
}

static int one_event(Out *o, Ev *ev, int64_t idx) {
    if (ev->ph.type != V_STR || ev->ph.esc) return 0;
    int64_t phn = ev->ph.e - ev->ph.s;
    if (phn != 1) return 0;
    uint8_t ph = ev->ph.s[0];
    int labelled = ph == 'X' || ph == 's' || ph == 'f' || ph == 't' || ph == 'i' || ph == 'I' || ph == 'C' || ph == 'M';
    if (!labelled) {
        /* the Chrome phases the tables skip (decode.IGNORED_PHASES); others: Python decides */
        static const char ignored[] = "BEbenSTpFPNODRc()vV";
        return memchr(ignored, ph, sizeof(ignored) - 1) != NULL;
    }
    int64_t pid = 0, tid = 0;
    int pnull, tnull;
    if (!reg_label(o, &ev->pid, &pid, &pnull)) return 0;
    if (!reg_label(o, &ev->tid, &tid, &tnull)) return 0;
    Col **t;
    switch (ph) {
    case 'X': {
        int64_t ts, dur;
        if (ev->name.type != V_STR) return 0;
        if (ev->cat.type != V_NONE && ev->cat.type != V_NULL && ev->cat.type != V_STR) return 0;
        if (ev->cat.type == V_STR && !ev->cat.esc && ev->cat.e - ev->cat.s == g_profiler_cat_len &&
            memcmp(ev->cat.s, g_profiler_cat, (size_t)g_profiler_cat_len) == 0)
            return 0; /* CUPTI counters: the Python path */
        if (ev->ts.type != V_INT && ev->ts.type != V_FLOAT) return 0;
        if (ev->dur.type != V_INT && ev->dur.type != V_FLOAT) return 0;
        if (!ns_value(&ev->ts, &ts) || !ns_value(&ev->dur, &dur)) return 0;
        t = o->t[T_EVENTS];
        int64_t row = t[E_IDX]->n;
        if (!col_i64(t[E_IDX], idx)) return 0;
        if (ev->cat.type == V_STR) { if (!put_opt_str(t[E_CAT], &ev->cat)) return 0; }
        else if (!col_str(t[E_CAT], "", 0)) return 0;
        if (!put_opt_str(t[E_NAME], &ev->name)) return 0;
        if (!put_id(t[E_PID], pid, pnull) || !put_id(t[E_TID], tid, tnull)) return 0;
        if (!col_i64(t[E_TS], ts) || !col_i64(t[E_DUR], dur)) return 0;
        return x_args(o, ev, &ev->args, row);
    }
    case 's':
    case 'f':
    case 't': {
        int64_t ts;
        if (!ts_or_zero(&ev->ts, &ts)) return 0;
        t = o->t[T_FLOWS];
        char phs[1] = {(char)ph};
        return col_i64(t[F_IDX], idx) && col_str(t[F_PH], phs, 1) && put_opt_str(t[F_CAT], &ev->cat) &&
               put_opt_str(t[F_NAME], &ev->name) && put_opt_int(t[F_ID], &ev->id) && put_id(t[F_PID], pid, pnull) &&
               put_id(t[F_TID], tid, tnull) && col_i64(t[F_TS], ts) && put_opt_str(t[F_BP], &ev->bp);
    }
    case 'i':
    case 'I': {
        int64_t ts;
        Val a[6];
        for (int i = 0; i < 6; i++) a[i].type = V_NONE;
        if (!ts_or_zero(&ev->ts, &ts)) return 0;
        if (ev->args.type == V_OBJ) {
            ObjIter it;
            Val key, val;
            int r;
            obj_begin(&it, &ev->args, ev);
            while ((r = obj_next(&it, &key, &val)) == 1) {
                if (key.esc) return 0;
                int64_t n = key.e - key.s;
                for (int i = 0; i < 6; i++) {
                    if ((int64_t)strlen(INSTANT_KEYS[i]) == n && memcmp(INSTANT_KEYS[i], key.s, (size_t)n) == 0) {
                        if (a[i].type != V_NONE) return 0;
                        a[i] = val;
                    }
                }
            }
            if (r < 0) return 0;
        } else if (ev->args.type != V_NONE && ev->args.type != V_NULL) {
            return 0;
        }
        t = o->t[T_INSTANTS];
        if (!(col_i64(t[I_IDX], idx) && put_opt_str(t[I_CAT], &ev->cat) && put_opt_str(t[I_NAME], &ev->name) &&
              put_id(t[I_PID], pid, pnull) && put_id(t[I_TID], tid, tnull) && col_i64(t[I_TS], ts) &&
              put_opt_str(t[I_SCOPE], &ev->s)))
            return 0;
        for (int i = 0; i < 6; i++)
            if (!put_opt_int(t[I_A0 + i], &a[i])) return 0;
        return 1;
    }
    case 'M': {
        Val an = {0}, al = {0}, as = {0};
        if (ev->args.type == V_OBJ) {
            ObjIter it;
            Val key, val;
            int r;
            obj_begin(&it, &ev->args, ev);
            while ((r = obj_next(&it, &key, &val)) == 1) {
                if (key.esc) return 0;
                int64_t n = key.e - key.s;
                Val *slot = KEYIS(key.s, n, "name") ? &an : KEYIS(key.s, n, "labels") ? &al : KEYIS(key.s, n, "sort_index") ? &as : NULL;
                if (slot) {
                    if (slot->type != V_NONE) return 0;
                    *slot = val;
                }
            }
            if (r < 0) return 0;
        } else if (ev->args.type != V_NONE && ev->args.type != V_NULL) {
            return 0;
        }
        t = o->t[T_META];
        return col_i64(t[M_IDX], idx) && put_opt_str(t[M_NAME], &ev->name) && put_id(t[M_PID], pid, pnull) &&
               put_id(t[M_TID], tid, tnull) && put_opt_str(t[M_ANAME], &an) && put_opt_str(t[M_ALABELS], &al) &&
               put_opt_int(t[M_ASORT], &as);
    }
    case 'C': {
        if (ev->args.type != V_OBJ) return 1; /* no rows (the reference reads nothing else) */
        int64_t ts;
        if (!ts_or_zero(&ev->ts, &ts)) return 0;
        if (ev->name.type != V_NONE && ev->name.type != V_NULL && ev->name.type != V_STR) return 0;
        t = o->t[T_COUNTERS];
        ObjIter it;
        Val key, val;
        int r;
        const uint8_t *seen[64];
        int64_t seenlen[64];
        int nseen = 0;
        obj_begin(&it, &ev->args, ev);
        while ((r = obj_next(&it, &key, &val)) == 1) {
            if (key.esc || nseen >= 64) return 0;
            int64_t n = key.e - key.s;
            for (int i = 0; i < nseen; i++)
                if (seenlen[i] == n && memcmp(seen[i], key.s, (size_t)n) == 0) return 0;
            seen[nseen] = key.s;
            seenlen[nseen++] = n;
            double d = 0;
            int isnull = 0;
            switch (val.type) {
            case V_INT:
            case V_FLOAT: if (!float_value(&val, &d)) return 0; break;
            case V_TRUE: d = 1.0; break;
            case V_FALSE: d = 0.0; break;
            case V_NULL:
            case V_ARR:
            case V_OBJ: isnull = 1; break;
            default: return 0; /* a string: Python's float() rules */
            }
            if (!(col_i64(t[K_IDX], idx) && put_opt_str(t[K_NAME], &ev->name) && put_id(t[K_PID], pid, pnull) &&
                  col_i64(t[K_TS], ts) && col_str(t[K_KEY], (const char *)key.s, n) &&
                  (isnull ? col_null(t[K_VALUE]) : col_f64(t[K_VALUE], d))))
                return 0;
        }
        return r == 0;
    }
    }
    return 0;
}

/* The whole chunk. 1: decoded; 0: give up (o->why says why). */
static int decode_all(Out *o, const uint8_t *buf, Py_ssize_t n) {
    Scan sc = {buf, buf + n};
    /* CUPTI profiler ranges go to the Python path: find out at memchr speed, not after
       scanning the chunk up to the first one (a name that merely contains the text goes too) */
    if (memmem(buf, (size_t)n, g_profiler_cat, (size_t)g_profiler_cat_len) != NULL) {
        o->why = "cuda_profiler_range events";
        return 0;
    }
    skip_ws(&sc);
    if (sc.p >= sc.end || *sc.p != '[') { o->why = "no '['"; return 0; }
    sc.p++;
    skip_ws(&sc);
    if (sc.p < sc.end && *sc.p == ']') {
        sc.p++;
    } else {
        while (1) {
            Ev ev;
            o->why_at = sc.p - buf;
            if (sc.p >= sc.end || *sc.p != '{') { o->why = "an event that is not an object"; return 0; }
            if (!scan_event(&sc, &ev)) { o->why = "syntax (or truncation) inside an event"; return 0; }
            if (!one_event(o, &ev, o->n_events)) { o->why = "an event the Python rules must judge"; return 0; }
            o->n_events++;
            skip_ws(&sc);
            if (sc.p >= sc.end) { o->why = "truncated after an event"; return 0; }
            if (*sc.p == ',') { sc.p++; skip_ws(&sc); continue; }
            if (*sc.p == ']') { sc.p++; break; }
            o->why = "syntax after an event";
            return 0;
        }
    }
    skip_ws(&sc);
    o->end_rel = sc.p >= sc.end ? -1 : (int64_t)(sc.p - buf);
    return 1;
}

/* ------------------------------------------------------------------ Python: Column */
typedef struct {
    PyObject_HEAD
    Col *col;
} ColumnObject;

static void column_dealloc(ColumnObject *self) {
    col_free(self->col);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static void release_schema(struct ArrowSchema *s) {
    s->release = NULL;
}

static void release_array(struct ArrowArray *a) {
    col_free((Col *)a->private_data);
    free(a->buffers);
    a->release = NULL;
}

static void schema_capsule_free(PyObject *cap) {
    struct ArrowSchema *s = (struct ArrowSchema *)PyCapsule_GetPointer(cap, "arrow_schema");
    if (s) {
        if (s->release) s->release(s);
        free(s);
    }
}

static void array_capsule_free(PyObject *cap) {
    struct ArrowArray *a = (struct ArrowArray *)PyCapsule_GetPointer(cap, "arrow_array");
    if (a) {
        if (a->release) a->release(a);
        free(a);
    }
}

/* Column.__arrow_c_array__(requested_schema=None): hands the buffers over (once). */
static PyObject *column_arrow(ColumnObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"requested_schema", NULL};
    PyObject *req = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &req)) return NULL;
    Col *c = self->col;
    if (!c) {
        PyErr_SetString(PyExc_RuntimeError, "column already exported");
        return NULL;
    }
    /* non-empty buffers even for zero rows */
    if (!col_grow(c, 1) || (c->kind == C_STR && !sgrow(c, 1))) return PyErr_NoMemory();
    col_shrink(c);
    struct ArrowSchema *s = (struct ArrowSchema *)calloc(1, sizeof(*s));
    struct ArrowArray *a = (struct ArrowArray *)calloc(1, sizeof(*a));
    const void **bufs = (const void **)calloc(3, sizeof(void *));
    if (!s || !a || !bufs) {
        free(s); free(a); free(bufs);
        return PyErr_NoMemory();
    }
    s->format = c->kind == C_I64 ? "l" : c->kind == C_F64 ? "g" : "U";
    s->name = "";
    s->flags = ARROW_FLAG_NULLABLE;
    s->release = release_schema;
    bufs[0] = c->nulls ? c->valid : NULL;
    bufs[1] = c->data;
    bufs[2] = c->sdata;
    a->length = c->n;
    a->null_count = c->nulls;
    a->n_buffers = c->kind == C_STR ? 3 : 2;
    a->buffers = bufs;
    a->release = release_array;
    a->private_data = c;
    PyObject *sc = PyCapsule_New(s, "arrow_schema", schema_capsule_free);
    if (!sc) {
        free(s); free(a); free(bufs);
        return NULL;
    }
    self->col = NULL; /* the array owns the buffers now */
    PyObject *ac = PyCapsule_New(a, "arrow_array", array_capsule_free);
    if (!ac) {
        release_array(a);
        free(a);
        Py_DECREF(sc);
        return NULL;
    }
    return Py_BuildValue("(NN)", sc, ac);
}

static PyObject *column_len(ColumnObject *self, PyObject *unused) {
    return PyLong_FromLongLong(self->col ? self->col->n : -1);
}

static PyMethodDef column_methods[] = {
    {"__arrow_c_array__", (PyCFunction)(void (*)(void))column_arrow, METH_VARARGS | METH_KEYWORDS,
     "Arrow PyCapsule interface: (schema, array) capsules; the buffers move to the array."},
    {"rows", (PyCFunction)column_len, METH_NOARGS, "rows (-1 once exported)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ColumnType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kinetoscope.trace._native._decoder.Column",
    .tp_basicsize = sizeof(ColumnObject),
    .tp_dealloc = (destructor)column_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One column's buffers (Arrow C data interface).",
    .tp_methods = column_methods,
};

static PyObject *wrap_col(Col **slot) {
    ColumnObject *o = PyObject_New(ColumnObject, &ColumnType);
    if (!o) return NULL;
    o->col = *slot;
    *slot = NULL;
    return (PyObject *)o;
}

static int add_table(PyObject *tables, const char *tname, Col **cols, const char **names, int n) {
    if (cols[0]->n == 0) return 1;
    PyObject *d = PyDict_New();
    if (!d) return 0;
    for (int i = 0; i < n; i++) {
        PyObject *c = wrap_col(&cols[i]);
        if (!c || PyDict_SetItemString(d, names[i], c) < 0) {
            Py_XDECREF(c);
            Py_DECREF(d);
            return 0;
        }
        Py_DECREF(c);
    }
    int r = PyDict_SetItemString(tables, tname, d);
    Py_DECREF(d);
    return r == 0;
}

/* decode_chunk(data) -> (n_events, end, tables, labels) or (None, why, offset) */
static PyObject *decode_chunk(PyObject *mod, PyObject *arg) {
    Py_buffer view;
    if (g_nkeys == 0) {
        PyErr_SetString(PyExc_RuntimeError, "configure() first");
        return NULL;
    }
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Out *o = (Out *)calloc(1, sizeof(Out));
    if (!o) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    o->hint = (int64_t)(view.len / 256);
    if (!table_init(o, T_EVENTS, E_N, E_KINDS) || !table_init(o, T_FLOWS, F_N, F_KINDS) ||
        !table_init(o, T_INSTANTS, I_N, I_KINDS) || !table_init(o, T_META, M_N, M_KINDS) ||
        !table_init(o, T_COUNTERS, K_N, K_KINDS)) {
        out_free(o);
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    int ok;
#ifdef KS_KEEP_GIL
    ok = decode_all(o, (const uint8_t *)view.buf, view.len);
#else
    Py_BEGIN_ALLOW_THREADS
    ok = decode_all(o, (const uint8_t *)view.buf, view.len);
    Py_END_ALLOW_THREADS
#endif
    PyObject *res = NULL;
    if (!ok) {
        res = Py_BuildValue("(Osn)", Py_None, o->why ? o->why : "out of memory", (Py_ssize_t)o->why_at);
        goto done;
    }
    PyObject *tables = PyDict_New();
    PyObject *labels = PyList_New(0);
    if (!tables || !labels) goto fail;
    if (!add_table(tables, "events", o->t[T_EVENTS], E_NAMES, E_N) ||
        !add_table(tables, "flows", o->t[T_FLOWS], F_NAMES, F_N) ||
        !add_table(tables, "instants", o->t[T_INSTANTS], I_NAMES, I_N) ||
        !add_table(tables, "meta_rows", o->t[T_META], M_NAMES, M_N) ||
        !add_table(tables, "counters", o->t[T_COUNTERS], K_NAMES, K_N))
        goto fail;
    {
        PyObject *args = PyList_New(0);
        if (!args) goto fail;
        for (int i = 0; i < g_ncols; i++) {
            if (!o->args[i]) continue;
            PyObject *c = wrap_col(&o->args[i]);
            PyObject *pair = c ? Py_BuildValue("(iN)", i, c) : NULL;
            if (!pair || PyList_Append(args, pair) < 0) {
                Py_XDECREF(pair);
                Py_DECREF(args);
                goto fail;
            }
            Py_DECREF(pair);
        }
        if (PyDict_SetItemString(tables, "args", args) < 0) {
            Py_DECREF(args);
            goto fail;
        }
        Py_DECREF(args);
    }
    for (int i = 0; i < o->nlabels; i++) {
        PyObject *s = PyUnicode_DecodeUTF8((const char *)o->labels[i].s, (Py_ssize_t)o->labels[i].len, "strict");
        PyObject *pair = s ? Py_BuildValue("(Nn)", s, (Py_ssize_t)(-(i + 1))) : NULL;
        if (!pair || PyList_Append(labels, pair) < 0) {
            Py_XDECREF(pair);
            goto fail;
        }
        Py_DECREF(pair);
    }
    res = Py_BuildValue("(nnNN)", (Py_ssize_t)o->n_events, (Py_ssize_t)o->end_rel, tables, labels);
    tables = labels = NULL;
    goto done;
fail:
    Py_XDECREF(tables);
    Py_XDECREF(labels);
    res = NULL;
done:
    out_free(o);
    PyBuffer_Release(&view);
    return res;
}

/* configure(keys: list[(key: str, column: int, kind: int)], ncols: int) */
static PyObject *configure(PyObject *mod, PyObject *args) {
    PyObject *keys;
    int ncols;
    if (!PyArg_ParseTuple(args, "O!i", &PyList_Type, &keys, &ncols)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (n > MAX_ARG_KEYS || ncols > MAX_ARG_COLS || ncols < 0) {
        PyErr_SetString(PyExc_ValueError, "too many args keys or columns");
        return NULL;
    }
    for (int i = 0; i < g_nkeys; i++) free(g_keys[i].key);
    g_nkeys = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *k;
        Py_ssize_t len;
        int col, kind;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(keys, i), "s#ii", &k, &len, &col, &kind)) return NULL;
        if (col < 0 || col >= ncols || kind < C_I64 || kind > C_STR) {
            PyErr_SetString(PyExc_ValueError, "bad column or kind");
            return NULL;
        }
        char *copy = (char *)malloc((size_t)len + 1);
        if (!copy) return PyErr_NoMemory();
        memcpy(copy, k, (size_t)len + 1);
        g_keys[g_nkeys].key = copy;
        g_keys[g_nkeys].len = len;
        g_keys[g_nkeys].col = col;
        g_keys[g_nkeys].kind = kind;
        g_colkind[col] = kind;
        g_nkeys++;
    }
    g_ncols = ncols;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode_chunk", decode_chunk, METH_O,
     "decode_chunk(data) -> (n_events, end, tables, labels), or (None, why, offset) to fall back"},
    {"configure", configure, METH_VARARGS, "configure(keys, ncols): the args keys -> columns"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_decoder", "Native trace chunk decoder.", -1, methods};

PyMODINIT_FUNC PyInit__decoder(void) {
#if defined(__GLIBC__)
    if (!g_c_locale) g_c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (!g_c_locale) {
        PyErr_SetString(PyExc_ImportError, "newlocale(C) failed");
        return NULL;
    }
#endif
    if (PyType_Ready(&ColumnType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    Py_INCREF(&ColumnType);
    if (PyModule_AddObject(m, "Column", (PyObject *)&ColumnType) < 0) {
        Py_DECREF(&ColumnType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "I64", C_I64);
    PyModule_AddIntConstant(m, "F64", C_F64);
    PyModule_AddIntConstant(m, "STR", C_STR);
    return m;
}
