/*
 * Fast decoding of an XPlane's lines and events straight from the protobuf
 * wire format, into packed column buffers that Python wraps as numpy arrays.
 *
 * Decoding millions of events through protobuf message objects costs about a
 * microsecond per field access from Python; this walks the bytes once.  Only
 * the lines (XPlane field 3) are decoded here: the plane's small fields
 * (name, metadata maps, plane stats) are returned as byte spans that Python
 * parses with the protobuf runtime.  Field numbers are those of schema.py.
 *
 * decode_plane(buffer, wanted_stat_ids: bytes of int64, with_lines=True) returns a tuple
 * (with_lines=False only collects the shell spans, skipping the lines undecoded):
 *   shell_spans  list of (start, end) byte spans of every non-line field
 *   lines        list of (id, name, display_name, timestamp_ns, first_event, n_events)
 *   md, off, dur bytes of int64, one entry per event (events of all lines in order)
 *   st_event     list, per wanted stat id: bytes of int64, the events carrying it
 *   st_type      list, per wanted stat id: bytes of int8, 1 int64, 2 uint64, 3 ref,
 *                4 str (index into strings), 5 double (value holds the bits), 6 bytes (unused)
 *   st_value     list, per wanted stat id: bytes of int64
 *   strings      list of str values met in wanted stats
 * Raises ValueError on malformed or truncated input.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    char *data;
    size_t len;
    size_t cap;
} Buf;

static int buf_put(Buf *b, const void *src, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + n) cap *= 2;
        char *data = realloc(b->data, cap);
        if (!data) return -1;
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

static int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *out) {
    uint64_t result = 0;
    int shift = 0;
    while (*p < end && shift < 64) {
        uint8_t byte = *(*p)++;
        result |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *out = result;
            return 0;
        }
        shift += 7;
    }
    return -1;
}

/* Advance past one field's payload; for length-delimited fields return its bounds. */
static int skip_payload(const uint8_t **p, const uint8_t *end, int wire,
                        const uint8_t **start, const uint8_t **stop) {
    uint64_t v;
    switch (wire) {
    case 0:
        return read_varint(p, end, &v);
    case 1:
        if (end - *p < 8) return -1;
        *p += 8;
        return 0;
    case 2:
        if (read_varint(p, end, &v) < 0 || v > (uint64_t)(end - *p)) return -1;
        if (start) *start = *p;
        *p += v;
        if (stop) *stop = *p;
        return 0;
    case 5:
        if (end - *p < 4) return -1;
        *p += 4;
        return 0;
    default:
        return -1;
    }
}

#define MAX_WANTED 64

typedef struct {
    const int64_t *wanted;
    Py_ssize_t n_wanted;
    Buf md, off, dur;
    Buf st_event[MAX_WANTED], st_type[MAX_WANTED], st_value[MAX_WANTED];
    PyObject *strings;
    int64_t n_events;
} State;

static int find_slot(const State *s, int64_t id) {
    for (Py_ssize_t i = 0; i < s->n_wanted; i++)
        if (s->wanted[i] == id) return (int)i;
    return -1;
}

static int decode_stat(State *s, const uint8_t *p, const uint8_t *end, int64_t event) {
    int64_t metadata_id = 0, value = 0;
    int8_t type = 0;
    const uint8_t *text = NULL, *text_end = NULL;
    while (p < end) {
        uint64_t key, v;
        if (read_varint(&p, end, &key) < 0) return -1;
        int field = (int)(key >> 3), wire = (int)(key & 7);
        if (field == 1 && wire == 0) {
            if (read_varint(&p, end, &v) < 0) return -1;
            metadata_id = (int64_t)v;
        } else if ((field == 3 || field == 4 || field == 7) && wire == 0) {
            if (read_varint(&p, end, &v) < 0) return -1;
            value = (int64_t)v;
            type = field == 4 ? 1 : (field == 3 ? 2 : 3);
        } else if (field == 2 && wire == 1) {
            if (end - p < 8) return -1;
            memcpy(&value, p, 8);
            p += 8;
            type = 5;
        } else if ((field == 5 || field == 6) && wire == 2) {
            if (skip_payload(&p, end, wire, &text, &text_end) < 0) return -1;
            type = field == 5 ? 4 : 6;
        } else if (skip_payload(&p, end, wire, NULL, NULL) < 0) {
            return -1;
        }
    }
    int slot = find_slot(s, metadata_id);
    if (slot < 0 || type == 0) return 0;
    if (type == 4) {  /* strings are made only for wanted stats */
        PyObject *str = PyUnicode_DecodeUTF8((const char *)text, text_end - text, "replace");
        if (!str) return -2;
        value = PyList_GET_SIZE(s->strings);
        int rc = PyList_Append(s->strings, str);
        Py_DECREF(str);
        if (rc < 0) return -2;
    }
    if (buf_put(&s->st_event[slot], &event, 8) || buf_put(&s->st_type[slot], &type, 1) ||
        buf_put(&s->st_value[slot], &value, 8))
        return -3;
    return 0;
}

static int decode_event(State *s, const uint8_t *p, const uint8_t *end) {
    int64_t metadata_id = 0, offset = 0, duration = 0;
    int64_t event = s->n_events;
    while (p < end) {
        uint64_t key, v;
        if (read_varint(&p, end, &key) < 0) return -1;
        int field = (int)(key >> 3), wire = (int)(key & 7);
        if (wire == 0 && (field == 1 || field == 2 || field == 3 || field == 5)) {
            if (read_varint(&p, end, &v) < 0) return -1;
            if (field == 1) metadata_id = (int64_t)v;
            else if (field == 2) offset = (int64_t)v;
            else if (field == 3) duration = (int64_t)v;
        } else if (field == 4 && wire == 2) {
            const uint8_t *a, *b;
            if (skip_payload(&p, end, wire, &a, &b) < 0) return -1;
            int rc = decode_stat(s, a, b, event);
            if (rc < 0) return rc;
        } else if (skip_payload(&p, end, wire, NULL, NULL) < 0) {
            return -1;
        }
    }
    if (buf_put(&s->md, &metadata_id, 8) || buf_put(&s->off, &offset, 8) ||
        buf_put(&s->dur, &duration, 8))
        return -3;
    s->n_events++;
    return 0;
}

static PyObject *decode_line(State *s, const uint8_t *p, const uint8_t *end, int *err) {
    int64_t id = 0, timestamp = 0;
    const uint8_t *name = NULL, *name_end = NULL, *display = NULL, *display_end = NULL;
    int64_t first = s->n_events;
    while (p < end) {
        uint64_t key, v;
        if (read_varint(&p, end, &key) < 0) { *err = -1; return NULL; }
        int field = (int)(key >> 3), wire = (int)(key & 7);
        if (wire == 0 && (field == 1 || field == 3)) {
            if (read_varint(&p, end, &v) < 0) { *err = -1; return NULL; }
            if (field == 1) id = (int64_t)v; else timestamp = (int64_t)v;
        } else if (wire == 2 && (field == 2 || field == 4 || field == 11)) {
            const uint8_t *a, *b;
            if (skip_payload(&p, end, wire, &a, &b) < 0) { *err = -1; return NULL; }
            if (field == 2) { name = a; name_end = b; }
            else if (field == 11) { display = a; display_end = b; }
            else {
                int rc = decode_event(s, a, b);
                if (rc < 0) { *err = rc; return NULL; }
            }
        } else if (skip_payload(&p, end, wire, NULL, NULL) < 0) {
            *err = -1;
            return NULL;
        }
    }
    PyObject *name_str = PyUnicode_DecodeUTF8(name ? (const char *)name : "", name ? name_end - name : 0, "replace");
    PyObject *display_str = PyUnicode_DecodeUTF8(display ? (const char *)display : "",
                                                 display ? display_end - display : 0, "replace");
    if (!name_str || !display_str) {
        Py_XDECREF(name_str);
        Py_XDECREF(display_str);
        *err = -2;
        return NULL;
    }
    return Py_BuildValue("(LNNLLL)", (long long)id, name_str, display_str, (long long)timestamp,
                         (long long)first, (long long)(s->n_events - first));
}

static PyObject *bytes_of(Buf *b) {
    return PyBytes_FromStringAndSize(b->data ? b->data : "", (Py_ssize_t)b->len);
}

static void free_state(State *s) {
    free(s->md.data);
    free(s->off.data);
    free(s->dur.data);
    for (int i = 0; i < MAX_WANTED; i++) {
        free(s->st_event[i].data);
        free(s->st_type[i].data);
        free(s->st_value[i].data);
    }
    Py_XDECREF(s->strings);
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

static PyObject *decode_plane(PyObject *self, PyObject *args) {
    Py_buffer data, wanted;
    int with_lines = 1;
    if (!PyArg_ParseTuple(args, "y*y*|p", &data, &wanted, &with_lines)) return NULL;
    State s;
    memset(&s, 0, sizeof(s));
    s.wanted = (const int64_t *)wanted.buf;
    s.n_wanted = wanted.len / 8;
    if (s.n_wanted > MAX_WANTED) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&wanted);
        PyErr_SetString(PyExc_ValueError, "too many wanted stats");
        return NULL;
    }
    s.strings = PyList_New(0);
    PyObject *spans = PyList_New(0), *lines = PyList_New(0), *result = NULL;
    const uint8_t *base = (const uint8_t *)data.buf, *p = base, *end = base + data.len;
    int err = 0;
    if (!s.strings || !spans || !lines) { err = -2; goto done; }
    while (p < end) {
        const uint8_t *field_start = p;
        uint64_t key;
        if (read_varint(&p, end, &key) < 0) { err = -1; break; }
        int field = (int)(key >> 3), wire = (int)(key & 7);
        if (field == 3 && wire == 2 && !with_lines) {
            if (skip_payload(&p, end, wire, NULL, NULL) < 0) { err = -1; break; }
        } else if (field == 3 && wire == 2) {
            const uint8_t *a, *b;
            if (skip_payload(&p, end, wire, &a, &b) < 0) { err = -1; break; }
            PyObject *line = decode_line(&s, a, b, &err);
            if (!line) break;
            int rc = PyList_Append(lines, line);
            Py_DECREF(line);
            if (rc < 0) { err = -2; break; }
        } else {
            if (skip_payload(&p, end, wire, NULL, NULL) < 0) { err = -1; break; }
            PyObject *span = Py_BuildValue("(nn)", (Py_ssize_t)(field_start - base), (Py_ssize_t)(p - base));
            if (!span || PyList_Append(spans, span) < 0) { Py_XDECREF(span); err = -2; break; }
            Py_DECREF(span);
        }
    }
    if (!err) {
        result = Py_BuildValue("(OONNNNNNO)", spans, lines, bytes_of(&s.md), bytes_of(&s.off),
                               bytes_of(&s.dur), per_slot(s.st_event, s.n_wanted),
                               per_slot(s.st_type, s.n_wanted), per_slot(s.st_value, s.n_wanted),
                               s.strings);
    }
done:
    if (err == -1) PyErr_SetString(PyExc_ValueError, "malformed or truncated XPlane");
    else if (err == -3) PyErr_NoMemory();
    Py_XDECREF(spans);
    Py_XDECREF(lines);
    free_state(&s);
    PyBuffer_Release(&data);
    PyBuffer_Release(&wanted);
    return result;
}

static PyMethodDef methods[] = {
    {"decode_plane", decode_plane, METH_VARARGS, "Decode an XPlane's lines and events into columns."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_wire", NULL, -1, methods};

PyMODINIT_FUNC PyInit__wire(void) { return PyModule_Create(&module); }
