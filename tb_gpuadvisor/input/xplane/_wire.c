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
 * decode_plane(buffer, wanted_stat_ids: bytes of int64, with_lines=True, release_step=0)
 * returns (with_lines=False only collects the shell spans, skipping the lines undecoded;
 * release_step > 0 hands a writable buffer's pages back to the system each time that many
 * more bytes of events are decoded, for a scratch buffer the caller drops afterwards: what
 * was handed back reads as zeros after the call):
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
#include <sys/mman.h>
#include <unistd.h>
#define CAN_RELEASE 1
#else
#define CAN_RELEASE 0
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

/* A line, with its strings as offsets into the plane buffer (into the copies when releasing). */
typedef struct {
    int64_t id, timestamp, first, count;
    int64_t name_at, name_len, display_at, display_len;
} LineInfo;

typedef struct {
    const uint8_t *base;
    const int64_t *wanted;
    Py_ssize_t n_wanted;
    int8_t slot_of[SLOT_TABLE];
    Buf md, off, dur, lines, spans, texts; /* texts: (offset, length) pairs of str values */
    Buf st_event[MAX_WANTED], st_type[MAX_WANTED], st_value[MAX_WANTED];
    int64_t n_events, n_texts;
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

static int decode_line(State *s, const uint8_t *p, const uint8_t *end, int depth) {
    LineInfo line = {0};
    line.first = s->n_events;
    while (p < end) {
        uint64_t v;
        int field, wire;
        if (read_key(&p, end, &field, &wire) < 0) return MALFORMED;
        if (wire == 0 && (field == 1 || field == 3)) {
            if (read_varint(&p, end, &v) < 0) return MALFORMED;
            if (field == 1) line.id = (int64_t)v; else line.timestamp = (int64_t)v;
        } else if (wire == 2 && (field == 2 || field == 4 || field == 11)) {
            const uint8_t *a, *b;
            if (skip_payload(&p, end, field, wire, depth, &a, &b) < 0) return MALFORMED;
            if (field != 4 && !valid_utf8(a, b)) return BAD_UTF8;
            if (field == 2) {
                if (text_offset(s, a, b, &line.name_at)) return NO_MEMORY;
                line.name_len = b - a;
            } else if (field == 11) {
                if (text_offset(s, a, b, &line.display_at)) return NO_MEMORY;
                line.display_len = b - a;
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
                int rc = decode_line(s, a, b, MAX_DEPTH - 1);
                if (rc < 0) return rc;
            }
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

static PyObject *build_result(State *s) {
    const uint8_t *texts = s->release ? (const uint8_t *)s->copies.data : s->base;
    Py_ssize_t n_spans = (Py_ssize_t)(s->spans.len / 16), n_lines = (Py_ssize_t)(s->lines.len / sizeof(LineInfo));
    PyObject *spans = PyList_New(n_spans), *lines = PyList_New(n_lines), *strings = PyList_New(s->n_texts);
    if (!spans || !lines || !strings) goto fail;
    const int64_t *span = (const int64_t *)s->spans.data;
    for (Py_ssize_t i = 0; i < n_spans; i++) {
        PyObject *item = Py_BuildValue("(LL)", (long long)span[2 * i], (long long)span[2 * i + 1]);
        if (!item) goto fail;
        PyList_SET_ITEM(spans, i, item);
    }
    const LineInfo *info = (const LineInfo *)s->lines.data;
    for (Py_ssize_t i = 0; i < n_lines; i++) {
        const LineInfo *l = &info[i];
        PyObject *item = Py_BuildValue("(LNNLLL)", (long long)l->id, text_at(texts, l->name_at, l->name_len),
                                       text_at(texts, l->display_at, l->display_len), (long long)l->timestamp,
                                       (long long)l->first, (long long)l->count);
        if (!item) goto fail;
        PyList_SET_ITEM(lines, i, item);
    }
    const int64_t *text = (const int64_t *)s->texts.data;
    for (Py_ssize_t i = 0; i < s->n_texts; i++) {
        PyObject *item = text_at(texts, text[2 * i], text[2 * i + 1]);
        if (!item) goto fail;
        PyList_SET_ITEM(strings, i, item);
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

static PyObject *decode_plane(PyObject *self, PyObject *args) {
    Py_buffer data, wanted;
    int with_lines = 1;
    Py_ssize_t release_step = 0;
    if (!PyArg_ParseTuple(args, "y*y*|pn", &data, &wanted, &with_lines, &release_step)) return NULL;
    PyObject *result = NULL;
    State *s = calloc(1, sizeof(State));
    if (!s) {
        PyErr_NoMemory();
        goto done;
    }
    s->base = s->released = (const uint8_t *)data.buf;
    s->release = data.readonly || release_step < 0 ? 0 : release_step;
    s->wanted = (const int64_t *)wanted.buf;
    s->n_wanted = wanted.len / 8;
    if (s->n_wanted > MAX_WANTED) {
        PyErr_SetString(PyExc_ValueError, "too many wanted stats");
        goto done;
    }
    memset(s->slot_of, -1, sizeof(s->slot_of));
    for (Py_ssize_t i = 0; i < s->n_wanted; i++)
        if (s->wanted[i] >= 0 && s->wanted[i] < SLOT_TABLE && s->slot_of[s->wanted[i]] < 0)
            s->slot_of[s->wanted[i]] = (int8_t)i;
    int err;
    Py_BEGIN_ALLOW_THREADS
    err = decode_fields(s, s->base, s->base + data.len, with_lines);
    Py_END_ALLOW_THREADS
    if (err == MALFORMED) PyErr_SetString(PyExc_ValueError, "malformed or truncated XPlane");
    else if (err == BAD_UTF8) PyErr_SetString(PyExc_ValueError, "a string field is not valid UTF-8");
    else if (err == NO_MEMORY) PyErr_NoMemory();
    else result = build_result(s);
done:
    if (s) {
        free_state(s);
        free(s);
    }
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
