/*
 * Fast decoding of an XPlane's lines and events straight from the protobuf
 * wire format, into packed column buffers that Python wraps as numpy arrays.
 *
 * Decoding millions of events through protobuf message objects costs about a
 * microsecond per field access from Python; this walks the bytes once, without
 * holding the GIL (so two planes decode on two cores), and creates Python
 * objects only at the end.  Only the lines (XPlane field 3) are decoded here:
 * the plane's small fields (name, metadata maps, plane stats) are returned as
 * byte spans that Python parses with the protobuf runtime.  Field numbers are
 * those of schema.py.
 *
 * decode_plane(buffer, wanted_stat_ids: bytes of int64, with_lines=True, release_step=0, parts=1)
 * returns (with_lines=False only collects the shell spans, skipping the lines undecoded;
 * release_step > 0 hands a writable buffer's pages back to the system each time that many
 * more bytes of events are decoded, for a scratch buffer the caller drops afterwards: what
 * was handed back reads as zeros after the call; parts > 1 decodes the lines in that many
 * parts of about equal bytes on as many threads, cut between two fields of a line where a
 * line is longer than a part, and joins them: the result is the one decode in one part gives):
 *   shell_spans  list of (start, end) byte spans of every non-line field
 *   lines        list of (id, name, display_name, timestamp_ns, first_event, n_events)
 *   md, off, dur int64 columns, one entry per event (events of all lines in order)
 *   st_event     list, per wanted stat id: int32 column, the events carrying it (a plane holds fewer than 2^31)
 *   st_type      list, per wanted stat id: int8 column, 1 int64, 2 uint64, 3 ref,
 *                4 str (index into strings), 5 double (value holds the bits), 6 bytes (unused)
 *   st_value     list, per wanted stat id: int64 column
 * Columns are read-only buffers (numpy.frombuffer wraps them without a copy).
 *   strings      list of str values met in wanted stats
 * Raises ValueError on malformed or truncated input.
 *
 * The wire rules are those of the protobuf runtime that parses the same bytes on
 * the pure-Python path (so both decoders accept and refuse the same planes):
 * tags of at most 5 bytes with a field number of 1..2^29-1, groups (wire types
 * 3/4) skipped as unknown fields up to 100 levels of nesting, strict UTF-8 in
 * string fields, a field with an unexpected wire type treated as unknown, and
 * the last member of a oneof wins.
 *
 * count_plane(buffer, with_stats=True) returns (events, stats) of the plane's lines
 * without decoding them, for the memory estimate; it stops counting at malformed bytes.
 * with_stats=False steps over each event whole (several times faster) and gives 0 stats.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#define CAN_RELEASE 1
#define CAN_SPLIT 1
#else
#define CAN_RELEASE 0
#define CAN_SPLIT 0
#endif

#define MAX_WANTED 64
#define SLOT_TABLE 4096 /* stat metadata ids below this are looked up directly */

enum { OK = 0, MALFORMED = -1, BAD_UTF8 = -2, NO_MEMORY = -3 };
#define MAX_DEPTH 100 /* nesting the protobuf runtime allows below the message it parses */

typedef struct {
    char *data;
    size_t len;
    size_t cap;
} Buf;

static inline int buf_put(Buf *b, const void *src, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + n) cap *= 2;
        char *data = realloc(b->data, cap);
        if (!data) return NO_MEMORY;
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, src, n);
    b->len += n;
    return OK;
}

static inline int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *out) {
    const uint8_t *q = *p;
    if (q < end && !(*q & 0x80)) { /* most varints here are one byte */
        *out = *q;
        *p = q + 1;
        return OK;
    }
    uint64_t result = 0;
    for (int shift = 0; q < end && shift < 64; shift += 7) {
        uint8_t byte = *q++;
        result |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *out = result;
            *p = q;
            return OK;
        }
    }
    return MALFORMED;
}

/* A field tag: a varint of at most 5 bytes below 2^32, with a non-zero field number. */
static inline int read_key(const uint8_t **p, const uint8_t *end, int *field, int *wire) {
    uint64_t key;
    const uint8_t *q = *p;
    const uint8_t *limit = end - q > 5 ? q + 5 : end;
    if (read_varint(&q, limit, &key) < 0 || key > 0xFFFFFFFFu || (key >> 3) == 0) return MALFORMED;
    *p = q;
    *field = (int)(key >> 3);
    *wire = (int)(key & 7);
    return OK;
}

static int skip_payload(const uint8_t **p, const uint8_t *end, int field, int wire, int depth,
                        const uint8_t **start, const uint8_t **stop);

/* Skip a group's fields up to its end tag (which must carry the group's field number). */
static int skip_group(const uint8_t **p, const uint8_t *end, int field, int depth) {
    if (depth <= 0) return MALFORMED;
    for (;;) {
        int inner, wire;
        if (*p >= end || read_key(p, end, &inner, &wire) < 0) return MALFORMED;
        if (wire == 4) return inner == field ? OK : MALFORMED;
        if (skip_payload(p, end, inner, wire, depth - 1, NULL, NULL) < 0) return MALFORMED;
    }
}

/* Advance past one field's payload; for length-delimited fields return its bounds. */
static int skip_payload(const uint8_t **p, const uint8_t *end, int field, int wire, int depth,
                        const uint8_t **start, const uint8_t **stop) {
    uint64_t v;
    switch (wire) {
    case 0:
        return read_varint(p, end, &v);
    case 1:
        if (end - *p < 8) return MALFORMED;
        *p += 8;
        return OK;
    case 2:
        if (read_varint(p, end, &v) < 0 || v > (uint64_t)(end - *p)) return MALFORMED;
        if (start) *start = *p;
        *p += v;
        if (stop) *stop = *p;
        return OK;
    case 3:
        return skip_group(p, end, field, depth);
    case 5:
        if (end - *p < 4) return MALFORMED;
        *p += 4;
        return OK;
    default:
        return MALFORMED;
    }
}

/* Strict UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF), as protobuf requires. */
static int valid_utf8(const uint8_t *p, const uint8_t *end) {
    while (p < end) {
        uint8_t c = *p;
        if (c < 0x80) { p++; continue; }
        int n;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) n = 1;
        else if (c == 0xE0) { n = 2; lo = 0xA0; }
        else if (c == 0xED) { n = 2; hi = 0x9F; }
        else if (c >= 0xE1 && c <= 0xEF) n = 2;
        else if (c == 0xF0) { n = 3; lo = 0x90; }
        else if (c == 0xF4) { n = 3; hi = 0x8F; }
        else if (c >= 0xF1 && c <= 0xF3) n = 3;
        else return 0;
        if (end - p <= n || p[1] < lo || p[1] > hi) return 0;
        for (int i = 2; i <= n; i++)
            if ((p[i] & 0xC0) != 0x80) return 0;
        p += n + 1;
    }
    return 1;
}

/* A line (or the piece of one that a part decoded), with its strings as offsets into the plane
 * buffer (into the part's copies when releasing); SEEN says which of its fields the piece met. */
enum { SEEN_ID = 1, SEEN_TIMESTAMP = 2, SEEN_NAME = 4, SEEN_DISPLAY = 8 };
typedef struct {
    int64_t id, timestamp, first, count;
    int64_t name_at, name_len, display_at, display_len;
    int64_t index, seen; /* the line's position among the plane's lines; SEEN_* bits */
} LineInfo;

typedef struct {
    const uint8_t *base;
    const int64_t *wanted;
    Py_ssize_t n_wanted;
    int8_t slot_of[SLOT_TABLE];
    Buf md, off, dur, lines, spans, texts; /* texts: (offset, length) pairs of str values */
    Buf st_event[MAX_WANTED], st_type[MAX_WANTED], st_value[MAX_WANTED];
    int64_t n_events, n_texts, n_lines;
    /* Releasing: the strings met are copied (the bytes behind them go), and the pages before
       RELEASED have been handed back. */
    Py_ssize_t release; /* bytes decoded between two hand-backs; 0: none */
    Buf copies;
    const uint8_t *released;
} State;

/* Hand back the whole pages of the buffer before P (decoded) once s->release more bytes are. */
static void release_before(State *s, const uint8_t *p) {
#if CAN_RELEASE
    if (!s->release || p - s->released < s->release) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t from = ((uintptr_t)s->released + page - 1) & ~(page - 1), to = (uintptr_t)p & ~(page - 1);
    if (to > from) {
        madvise((void *)from, to - from, MADV_DONTNEED);
        s->released = (const uint8_t *)to;
    }
#else
    (void)s;
    (void)p;
#endif
}

/* Where the string [A, B) will be read at the end: its offset in the buffer, or in the copies. */
static int text_offset(State *s, const uint8_t *a, const uint8_t *b, int64_t *at) {
    if (!s->release) {
        *at = (int64_t)(a - s->base);
        return OK;
    }
    *at = (int64_t)s->copies.len;
    return buf_put(&s->copies, a, (size_t)(b - a));
}

static inline int find_slot(const State *s, int64_t id) {
    if (id >= 0 && id < SLOT_TABLE) return s->slot_of[id];
    for (Py_ssize_t i = 0; i < s->n_wanted; i++)
        if (s->wanted[i] == id) return (int)i;
    return -1;
}

static int decode_stat(State *s, const uint8_t *p, const uint8_t *end, int64_t event, int depth) {
    int64_t metadata_id = 0, value = 0;
    int8_t type = 0;
    const uint8_t *text = NULL, *text_end = NULL;
    while (p < end) {
        uint64_t v;
        int field, wire;
        if (read_key(&p, end, &field, &wire) < 0) return MALFORMED;
        if (field == 1 && wire == 0) {
            if (read_varint(&p, end, &v) < 0) return MALFORMED;
            metadata_id = (int64_t)v;
        } else if ((field == 3 || field == 4 || field == 7) && wire == 0) {
            if (read_varint(&p, end, &v) < 0) return MALFORMED;
            value = (int64_t)v;
            type = field == 4 ? 1 : (field == 3 ? 2 : 3);
        } else if (field == 2 && wire == 1) {
            if (end - p < 8) return MALFORMED;
            memcpy(&value, p, 8);
            p += 8;
            type = 5;
        } else if ((field == 5 || field == 6) && wire == 2) {
            const uint8_t *a, *b;
            if (skip_payload(&p, end, field, wire, depth, &a, &b) < 0) return MALFORMED;
            if (field == 5 && !valid_utf8(a, b)) return BAD_UTF8;
            text = a;
            text_end = b;
            value = 0;
            type = field == 5 ? 4 : 6;
        } else if (skip_payload(&p, end, field, wire, depth, NULL, NULL) < 0) {
            return MALFORMED;
        }
    }
    int slot = find_slot(s, metadata_id);
    if (slot < 0 || type == 0) return OK;
    if (type == 4) { /* strings are made later, and only for wanted stats */
        int64_t span[2] = {0, (int64_t)(text_end - text)};
        if (text_offset(s, text, text_end, &span[0]) || buf_put(&s->texts, span, sizeof(span))) return NO_MEMORY;
        value = s->n_texts++;
    }
    int32_t row = (int32_t)event; /* decode_event keeps event indices below 2^31 */
    if (buf_put(&s->st_event[slot], &row, 4) || buf_put(&s->st_type[slot], &type, 1) ||
        buf_put(&s->st_value[slot], &value, 8))
        return NO_MEMORY;
    return OK;
}

static int decode_event(State *s, const uint8_t *p, const uint8_t *end, int depth) {
    int64_t metadata_id = 0, offset = 0, duration = 0;
    int64_t event = s->n_events;
    if (event >= INT32_MAX) return MALFORMED; /* a plane past protobuf's 2 GB limit */
    while (p < end) {
        uint64_t v;
        int field, wire;
        if (read_key(&p, end, &field, &wire) < 0) return MALFORMED;
        if (wire == 0 && (field == 1 || field == 2 || field == 3 || field == 5)) {
            if (read_varint(&p, end, &v) < 0) return MALFORMED;
            if (field == 1) metadata_id = (int64_t)v;
            else if (field == 2) offset = (int64_t)v;
            else if (field == 3) duration = (int64_t)v;
            else offset = 0; /* num_occurrences shares a oneof with offset_ps: the last one set wins */
        } else if (field == 4 && wire == 2) {
            const uint8_t *a, *b;
            if (skip_payload(&p, end, field, wire, depth, &a, &b) < 0) return MALFORMED;
            int rc = decode_stat(s, a, b, event, depth - 1);
            if (rc < 0) return rc;
        } else if (skip_payload(&p, end, field, wire, depth, NULL, NULL) < 0) {
            return MALFORMED;
        }
    }
    if (buf_put(&s->md, &metadata_id, 8) || buf_put(&s->off, &offset, 8) ||
        buf_put(&s->dur, &duration, 8))
        return NO_MEMORY;
    s->n_events++;
    return OK;
}

/* The line fields in [P, END) (all of line INDEX, or a piece of it cut between two fields). */
static int decode_line(State *s, const uint8_t *p, const uint8_t *end, int depth, int64_t index) {
    LineInfo line = {0};
    line.first = s->n_events;
    line.index = index;
    while (p < end) {
        uint64_t v;
        int field, wire;
        if (read_key(&p, end, &field, &wire) < 0) return MALFORMED;
        if (wire == 0 && (field == 1 || field == 3)) {
            if (read_varint(&p, end, &v) < 0) return MALFORMED;
            if (field == 1) line.id = (int64_t)v; else line.timestamp = (int64_t)v;
            line.seen |= field == 1 ? SEEN_ID : SEEN_TIMESTAMP;
        } else if (wire == 2 && (field == 2 || field == 4 || field == 11)) {
            const uint8_t *a, *b;
            if (skip_payload(&p, end, field, wire, depth, &a, &b) < 0) return MALFORMED;
            if (field != 4 && !valid_utf8(a, b)) return BAD_UTF8;
            if (field == 2) {
                if (text_offset(s, a, b, &line.name_at)) return NO_MEMORY;
                line.name_len = b - a;
                line.seen |= SEEN_NAME;
            } else if (field == 11) {
                if (text_offset(s, a, b, &line.display_at)) return NO_MEMORY;
                line.display_len = b - a;
                line.seen |= SEEN_DISPLAY;
            } else {
                int rc = decode_event(s, a, b, depth - 1);
                if (rc < 0) return rc;
                release_before(s, b);
            }
        } else if (skip_payload(&p, end, field, wire, depth, NULL, NULL) < 0) {
            return MALFORMED;
        }
    }
    line.count = s->n_events - line.first;
    return buf_put(&s->lines, &line, sizeof(line));
}

/* The whole plane: lines decoded (or skipped), every other field kept as a span. */
static int decode_fields(State *s, const uint8_t *p, const uint8_t *end, int with_lines) {
    while (p < end) {
        const uint8_t *field_start = p, *a, *b;
        int field, wire;
        if (read_key(&p, end, &field, &wire) < 0 || wire == 4) return MALFORMED;
        if (skip_payload(&p, end, field, wire, MAX_DEPTH, &a, &b) < 0) return MALFORMED;
        if (field == 3 && wire == 2) {
            if (with_lines) {
                int rc = decode_line(s, a, b, MAX_DEPTH - 1, s->n_lines);
                if (rc < 0) return rc;
            }
            s->n_lines++;
        } else {
            int64_t span[2] = {(int64_t)(field_start - s->base), (int64_t)(p - s->base)};
            if (buf_put(&s->spans, span, sizeof(span))) return NO_MEMORY;
        }
    }
    return OK;
}

/* Events (counts[0]) and stats (counts[1]) below a plane (level 0), line (1) or event (2);
 * DEEPEST 1 steps over each event whole (events counted, stats left at 0). */
static void count_fields(const uint8_t *p, const uint8_t *end, int level, int deepest, int64_t *counts) {
    static const int child[] = {3, 4, 4}; /* XPlane.lines, XLine.events, XEvent.stats */
    while (p < end) {
        const uint8_t *a, *b;
        int field, wire;
        if (read_key(&p, end, &field, &wire) < 0 || wire == 4 ||
            skip_payload(&p, end, field, wire, MAX_DEPTH, &a, &b) < 0)
            return;
        if (wire != 2 || field != child[level]) continue;
        if (level > 0) counts[level - 1]++;
        if (level < deepest) count_fields(a, b, level + 1, deepest, counts);
    }
}

/* A read-only buffer that owns a malloc'd column: numpy wraps it without copying. */
typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t len;
} Column;

static void column_dealloc(Column *self) {
    free(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int column_getbuffer(Column *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data, self->len, 1, flags);
}

static PyBufferProcs column_as_buffer = {(getbufferproc)column_getbuffer, NULL};

static PyTypeObject ColumnType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_wire.Column",
    .tp_basicsize = sizeof(Column),
    .tp_dealloc = (destructor)column_dealloc,
    .tp_as_buffer = &column_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A decoded column, exposed through the buffer protocol.",
};

/* Hands the buffer's memory to a Column (no copy); the Buf is left empty. */
static PyObject *bytes_of(Buf *b) {
    Column *column = PyObject_New(Column, &ColumnType);
    if (!column) return NULL;
    column->data = b->data;
    column->len = (Py_ssize_t)b->len;
    b->data = NULL;
    b->len = b->cap = 0;
    return (PyObject *)column;
}

static PyObject *text_at(const uint8_t *base, int64_t at, int64_t len) {
    if (len == 0) return PyUnicode_New(0, 0); /* the copies may hold nothing at all */
    return PyUnicode_DecodeUTF8((const char *)base + at, (Py_ssize_t)len, "replace");
}

/* A list with one bytes object per wanted stat, taken from BUFS. */
static PyObject *per_slot(Buf *bufs, Py_ssize_t n) {
    PyObject *list = PyList_New(n);
    if (!list) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = bytes_of(&bufs[i]);
        if (!b) { Py_DECREF(list); return NULL; }
        PyList_SET_ITEM(list, i, b);
    }
    return list;
}

#define MAX_PARTS 16

/* Where the strings of part S's lines and stat values are read at the end. */
static const uint8_t *texts_of(const State *s) {
    return s->release ? (const uint8_t *)s->copies.data : s->base;
}

/* Part 0's buffer (of every part's, BUFS[i] in part i) grown to hold them all, the others' bytes
 * copied after its own and freed (a large buffer grows in place or by remapping, not copying). */
static int join(Buf **bufs, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += bufs[i]->len;
    if (n < 2 || total == bufs[0]->len) return OK;
    if (total > bufs[0]->cap) {
        char *data = realloc(bufs[0]->data, total);
        if (!data) return NO_MEMORY;
        bufs[0]->data = data;
        bufs[0]->cap = total;
    }
    for (int i = 1; i < n; i++) {
        if (bufs[i]->len) memcpy(bufs[0]->data + bufs[0]->len, bufs[i]->data, bufs[i]->len);
        bufs[0]->len += bufs[i]->len;
        free(bufs[i]->data);
        bufs[i]->data = NULL;
        bufs[i]->len = bufs[i]->cap = 0;
    }
    return OK;
}

/* The parts' event columns joined into part 0's, event indices and string indices renumbered
 * from each part's first event and first string. */
static int join_columns(State **parts, int n) {
    if (n < 2) return OK;
    int64_t events = 0, texts = 0;
    for (int i = 0; i < n; i++) {
        State *s = parts[i];
        if (i > 0) {
            for (Py_ssize_t w = 0; w < s->n_wanted; w++) {
                int32_t *event = (int32_t *)s->st_event[w].data;
                const int8_t *type = (const int8_t *)s->st_type[w].data;
                int64_t *value = (int64_t *)s->st_value[w].data;
                size_t rows = s->st_type[w].len;
                for (size_t r = 0; r < rows; r++) {
                    event[r] += (int32_t)events;
                    if (type[r] == 4) value[r] += texts;
                }
            }
        }
        events += s->n_events;
        texts += s->n_texts;
    }
    if (events >= INT32_MAX) return MALFORMED; /* a plane past protobuf's 2 GB limit */
    Buf *bufs[MAX_PARTS];
#define JOIN(member)                                              \
    do {                                                          \
        for (int i = 0; i < n; i++) bufs[i] = &parts[i]->member; \
        if (join(bufs, n)) return NO_MEMORY;                      \
    } while (0)
    JOIN(md);
    JOIN(off);
    JOIN(dur);
    for (Py_ssize_t w = 0; w < parts[0]->n_wanted; w++) {
        JOIN(st_event[w]);
        JOIN(st_type[w]);
        JOIN(st_value[w]);
    }
#undef JOIN
    return OK;
}

/* One line of the result from its pieces (consecutive, in parts A..): counts added, and each
 * field the last piece that met it says (as the protobuf runtime keeps a repeated scalar's last). */
static PyObject *line_item(State **parts, const int64_t *first_event, int *part, Py_ssize_t *at, int n) {
    const LineInfo *head = (const LineInfo *)parts[*part]->lines.data + *at;
    int64_t index = head->index, first = head->first + first_event[*part], count = 0;
    LineInfo last = {0};
    const uint8_t *name = NULL, *display = NULL;
    while (*part < n) {
        const State *s = parts[*part];
        Py_ssize_t rows = (Py_ssize_t)(s->lines.len / sizeof(LineInfo));
        if (*at >= rows) {
            ++*part;
            *at = 0;
            continue;
        }
        const LineInfo *l = (const LineInfo *)s->lines.data + *at;
        if (l->index != index) break;
        count += l->count;
        if (l->seen & SEEN_ID) last.id = l->id;
        if (l->seen & SEEN_TIMESTAMP) last.timestamp = l->timestamp;
        if (l->seen & SEEN_NAME) { name = texts_of(s); last.name_at = l->name_at; last.name_len = l->name_len; }
        if (l->seen & SEEN_DISPLAY) {
            display = texts_of(s);
            last.display_at = l->display_at;
            last.display_len = l->display_len;
        }
        ++*at;
    }
    return Py_BuildValue("(LNNLLL)", (long long)last.id, text_at(name, last.name_at, last.name_len),
                         text_at(display, last.display_at, last.display_len), (long long)last.timestamp,
                         (long long)first, (long long)count);
}

static PyObject *build_result(State **parts, int n) {
    State *s = parts[0];
    int64_t first_event[MAX_PARTS], n_texts = 0;
    Py_ssize_t n_lines = 0;
    for (int i = 0; i < n; i++) {
        first_event[i] = i ? first_event[i - 1] + parts[i - 1]->n_events : 0;
        n_texts += parts[i]->n_texts;
        const LineInfo *info = (const LineInfo *)parts[i]->lines.data;
        for (Py_ssize_t j = 0; j < (Py_ssize_t)(parts[i]->lines.len / sizeof(LineInfo)); j++)
            n_lines += !(j == 0 && i > 0 && n_lines > 0 && info[0].index == n_lines - 1); /* a line cut between parts */
    }
    Py_ssize_t n_spans = (Py_ssize_t)(s->spans.len / 16);
    PyObject *spans = PyList_New(n_spans), *lines = PyList_New(n_lines), *strings = PyList_New(n_texts);
    if (!spans || !lines || !strings) goto fail;
    const int64_t *span = (const int64_t *)s->spans.data;
    for (Py_ssize_t i = 0; i < n_spans; i++) {
        PyObject *item = Py_BuildValue("(LL)", (long long)span[2 * i], (long long)span[2 * i + 1]);
        if (!item) goto fail;
        PyList_SET_ITEM(spans, i, item);
    }
    int part = 0;
    Py_ssize_t at = 0;
    for (Py_ssize_t i = 0; i < n_lines; i++) {
        while (part < n && at >= (Py_ssize_t)(parts[part]->lines.len / sizeof(LineInfo))) {
            part++;
            at = 0;
        }
        PyObject *item = line_item(parts, first_event, &part, &at, n);
        if (!item) goto fail;
        PyList_SET_ITEM(lines, i, item);
    }
    Py_ssize_t k = 0;
    for (int p = 0; p < n; p++) {
        const int64_t *text = (const int64_t *)parts[p]->texts.data;
        for (Py_ssize_t i = 0; i < parts[p]->n_texts; i++, k++) {
            PyObject *item = text_at(texts_of(parts[p]), text[2 * i], text[2 * i + 1]);
            if (!item) goto fail;
            PyList_SET_ITEM(strings, k, item);
        }
    }
    return Py_BuildValue("(NNNNNNNNN)", spans, lines, bytes_of(&s->md), bytes_of(&s->off), bytes_of(&s->dur),
                         per_slot(s->st_event, s->n_wanted), per_slot(s->st_type, s->n_wanted),
                         per_slot(s->st_value, s->n_wanted), strings);
fail:
    Py_XDECREF(spans);
    Py_XDECREF(lines);
    Py_XDECREF(strings);
    return NULL;
}

static void free_state(State *s) {
    Buf *bufs[] = {&s->md, &s->off, &s->dur, &s->lines, &s->spans, &s->texts, &s->copies};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free(bufs[i]->data);
    for (int i = 0; i < MAX_WANTED; i++) {
        free(s->st_event[i].data);
        free(s->st_type[i].data);
        free(s->st_value[i].data);
    }
}

/* A piece of a line (all of it, or the fields between two cuts) and the part that decodes it. */
typedef struct {
    const uint8_t *a, *b;
    int64_t index;
    int part;
} Piece;

/* PARTS runs of pieces of about equal bytes: the plane's top-level fields are walked (every
 * field that is not a line kept as a span in S), and a line that a cut falls in is walked field
 * by field up to the cut. Fails on malformed bytes (the serial decode then reports them). */
static int plan_parts(State *s, const uint8_t *p, const uint8_t *end, int parts, Buf *pieces) {
    Buf lines = {0};
    int rc = OK;
    int64_t index = 0;
    size_t total = 0;
    while (p < end && rc == OK) {
        const uint8_t *field_start = p, *a, *b;
        int field, wire;
        if (read_key(&p, end, &field, &wire) < 0 || wire == 4 ||
            skip_payload(&p, end, field, wire, MAX_DEPTH, &a, &b) < 0) {
            rc = MALFORMED;
        } else if (field == 3 && wire == 2) {
            Piece line = {a, b, index++, 0};
            total += (size_t)(b - a);
            rc = buf_put(&lines, &line, sizeof(line));
        } else {
            int64_t span[2] = {(int64_t)(field_start - s->base), (int64_t)(p - s->base)};
            rc = buf_put(&s->spans, span, sizeof(span));
        }
    }
    const Piece *line = (const Piece *)lines.data;
    size_t n_lines = lines.len / sizeof(Piece), before = 0; /* line bytes before the current line */
    int part = 0;
    for (size_t i = 0; i < n_lines && rc == OK; i++) {
        const uint8_t *a = line[i].a, *b = line[i].b, *from = a, *walk = a;
        /* the cuts (part k starts at k * total / parts bytes of lines) that fall inside this line */
        while (rc == OK && part + 1 < parts && before + (size_t)(b - a) > total * (size_t)(part + 1) / parts) {
            size_t cut = total * (size_t)(part + 1) / parts - before;
            while (walk < b && (size_t)(walk - a) < cut) {
                int field, wire;
                if (read_key(&walk, b, &field, &wire) < 0 ||
                    skip_payload(&walk, b, field, wire, MAX_DEPTH - 1, NULL, NULL) < 0)
                    rc = MALFORMED;
                if (rc) break;
            }
            if (rc == OK && walk > from) {
                Piece piece = {from, walk, line[i].index, part};
                rc = buf_put(pieces, &piece, sizeof(piece));
                from = walk;
            }
            part++;
        }
        if (rc == OK && (from < b || a == b)) {
            Piece piece = {from, b, line[i].index, part};
            rc = buf_put(pieces, &piece, sizeof(piece));
        }
        before += (size_t)(b - a);
    }
    free(lines.data);
    return rc;
}

typedef struct {
    State *s;
    const Piece *pieces;
    size_t n;
    int part, rc;
} PartJob;

static void *decode_part(void *arg) {
    PartJob *job = (PartJob *)arg;
    job->rc = OK;
    for (size_t i = 0; i < job->n && job->rc == OK; i++)
        if (job->pieces[i].part == job->part)
            job->rc = decode_line(job->s, job->pieces[i].a, job->pieces[i].b, MAX_DEPTH - 1, job->pieces[i].index);
    return NULL;
}

/* The plane's lines decoded in N parts on N threads (the calling one included); OK or the error
 * of the first part that failed, which is the error one serial decode meets first. */
static int decode_in_parts(State **parts, int n, const Buf *pieces) {
    PartJob jobs[MAX_PARTS];
    const Piece *piece = (const Piece *)pieces->data;
    size_t count = pieces->len / sizeof(Piece);
    for (int i = 0; i < n; i++) {
        jobs[i] = (PartJob){parts[i], piece, count, i, OK};
        for (size_t j = 0; j < count; j++)
            if (piece[j].part == i) { parts[i]->released = piece[j].a; break; } /* hand back its own pages only */
    }
#if CAN_SPLIT
    pthread_t threads[MAX_PARTS];
    int started[MAX_PARTS] = {0};
    for (int i = 1; i < n; i++) started[i] = pthread_create(&threads[i], NULL, decode_part, &jobs[i]) == 0;
    decode_part(&jobs[0]);
    for (int i = 1; i < n; i++) {
        if (started[i]) pthread_join(threads[i], NULL);
        else decode_part(&jobs[i]);
    }
#else
    for (int i = 0; i < n; i++) decode_part(&jobs[i]);
#endif
    for (int i = 0; i < n; i++)
        if (jobs[i].rc) return jobs[i].rc;
    return OK;
}

static State *new_state(const Py_buffer *data, const Py_buffer *wanted, Py_ssize_t release_step) {
    State *s = calloc(1, sizeof(State));
    if (!s) return NULL;
    s->base = s->released = (const uint8_t *)data->buf;
    s->release = data->readonly || release_step < 0 ? 0 : release_step;
    s->wanted = (const int64_t *)wanted->buf;
    s->n_wanted = wanted->len / 8;
    memset(s->slot_of, -1, sizeof(s->slot_of));
    for (Py_ssize_t i = 0; i < s->n_wanted && i < MAX_WANTED; i++)
        if (s->wanted[i] >= 0 && s->wanted[i] < SLOT_TABLE && s->slot_of[s->wanted[i]] < 0)
            s->slot_of[s->wanted[i]] = (int8_t)i;
    return s;
}

static PyObject *decode_plane(PyObject *self, PyObject *args) {
    Py_buffer data, wanted;
    int with_lines = 1, n = 1;
    Py_ssize_t release_step = 0;
    if (!PyArg_ParseTuple(args, "y*y*|pni", &data, &wanted, &with_lines, &release_step, &n)) return NULL;
    PyObject *result = NULL;
    State *parts[MAX_PARTS] = {NULL};
    Buf pieces = {0};
    n = n < 1 || !with_lines ? 1 : n > MAX_PARTS ? MAX_PARTS : n;
    if (wanted.len / 8 > MAX_WANTED) {
        PyErr_SetString(PyExc_ValueError, "too many wanted stats");
        goto done;
    }
    for (int i = 0; i < n; i++)
        if (!(parts[i] = new_state(&data, &wanted, release_step))) {
            PyErr_NoMemory();
            goto done;
        }
    const uint8_t *base = (const uint8_t *)data.buf;
    int err;
    Py_BEGIN_ALLOW_THREADS
    if (n > 1 && plan_parts(parts[0], base, base + data.len, n, &pieces) == OK) {
        err = decode_in_parts(parts, n, &pieces);
        if (err == OK) err = join_columns(parts, n);
    } else {
        parts[0]->spans.len = 0; /* a plan that failed may have kept some */
        n = 1;
        err = decode_fields(parts[0], base, base + data.len, with_lines);
    }
    Py_END_ALLOW_THREADS
    if (err == MALFORMED) PyErr_SetString(PyExc_ValueError, "malformed or truncated XPlane");
    else if (err == BAD_UTF8) PyErr_SetString(PyExc_ValueError, "a string field is not valid UTF-8");
    else if (err == NO_MEMORY) PyErr_NoMemory();
    else result = build_result(parts, n);
done:
    for (int i = 0; i < MAX_PARTS; i++)
        if (parts[i]) {
            free_state(parts[i]);
            free(parts[i]);
        }
    free(pieces.data);
    PyBuffer_Release(&data);
    PyBuffer_Release(&wanted);
    return result;
}

static PyObject *count_plane(PyObject *self, PyObject *args) {
    Py_buffer data;
    int with_stats = 1;
    if (!PyArg_ParseTuple(args, "y*|p", &data, &with_stats)) return NULL;
    int64_t counts[2] = {0, 0};
    Py_BEGIN_ALLOW_THREADS
    count_fields((const uint8_t *)data.buf, (const uint8_t *)data.buf + data.len, 0, with_stats ? 2 : 1, counts);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    return Py_BuildValue("(LL)", (long long)counts[0], (long long)counts[1]);
}

static PyMethodDef methods[] = {
    {"decode_plane", decode_plane, METH_VARARGS, "Decode an XPlane's lines and events into columns."},
    {"count_plane", count_plane, METH_VARARGS, "Count an XPlane's events and their stats without decoding."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_wire", NULL, -1, methods};

PyMODINIT_FUNC PyInit__wire(void) {
    if (PyType_Ready(&ColumnType) < 0) return NULL;
    return PyModule_Create(&module);
}
