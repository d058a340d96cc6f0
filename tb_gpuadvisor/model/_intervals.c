/*
 * Interval algebra on sorted int64 [start, end) sets in one pass each, without the temporaries
 * of the numpy formulas in intervals.py (a union of millions of events there allocates half a
 * dozen arrays of its size, and on a fresh mapping every page's first touch costs more than the
 * arithmetic). Each function here gives exactly the intervals its numpy twin gives (tests
 * compare them on random sets), so which one runs never changes a report.
 *
 * Every function writes into caller-allocated int64 buffers and returns how many intervals it
 * wrote, or -1 when an input is not sorted as required (the caller then uses the numpy path).
 * Inputs are C-contiguous int64 buffers ("sets" below: sorted by start, disjoint), masks uint8.
 * The GIL is released while they run.
 *
 * union(starts, ends, mask or None, out_s, out_e)
 *     starts nondecreasing (over the rows MASK keeps): merge overlapping or touching intervals.
 * merge_union(a_s, a_e, b_s, b_e, out_s, out_e)
 *     the union of two sets' intervals (each sorted by start), in one merge.
 * intersect(a_s, a_e, b_s, b_e, out_s, out_e)       capacity len(a) + len(b)
 * subtract(a_s, a_e, b_s, b_e, out_s, out_e)        capacity len(a) + len(b)
 *     A minus B; B's empty intervals cut nothing.
 * cut(a_s, a_e, b_s, b_e, out_s, out_e)             capacity len(a) + len(b)
 *     A minus a subset B of it, as the rank-wise pairing of the merged (A starts, B ends) and
 *     (A ends, B starts): B's empty intervals split A's pieces there.
 * covered_before(starts, cum, previous_end, times, out)
 *     intervals._Covered.before: for each time t, with i the count of starts <= t,
 *     cum[i] - max(previous_end[i] - t, 0); returns len(times).
 * chain_ends(release, durations, out)
 *     the replay's recurrence end[i] = max(release[i], end[i-1]) + durations[i]; returns len.
 * pairwise_overlaps([(starts, ends), ...], out)     at most 16 sets, out int64 k x k
 *     out[i][j] = the length of set i & set j, from one sweep over every boundary in time
 *     order keeping which sets cover each segment as a bitmask; returns k.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    Py_buffer view;
    const int64_t *at;
    Py_ssize_t n;
} In;

typedef struct {
    Py_buffer view;
    int64_t *at;
    Py_ssize_t cap;
} Out;

static int get_in(PyObject *obj, In *in) {
    if (PyObject_GetBuffer(obj, &in->view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    in->at = (const int64_t *)in->view.buf;
    in->n = in->view.len / (Py_ssize_t)sizeof(int64_t);
    return 0;
}

static int get_out(PyObject *obj, Out *out) {
    if (PyObject_GetBuffer(obj, &out->view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) return -1;
    out->at = (int64_t *)out->view.buf;
    out->cap = out->view.len / (Py_ssize_t)sizeof(int64_t);
    return 0;
}

/* Two input sets and two outputs, as every binary operation takes them. */
typedef struct {
    In as, ae, bs, be;
    Out os, oe;
    int held;
} Binary;

/* What a binary operation reads and writes, once the buffers are held. */
typedef struct {
    const int64_t *as, *ae, *bs, *be;
    Py_ssize_t na, nb, cap;
    int64_t *outs, *oute;
} Sets;

/* An operation run without the GIL: intervals written, or -1 (inputs it does not take). */
typedef Py_ssize_t (*BinaryOp)(const Sets *);

static void release_binary(Binary *b) {
    In *ins[] = {&b->as, &b->ae, &b->bs, &b->be};
    for (int i = 0; i < b->held && i < 4; i++) PyBuffer_Release(&ins[i]->view);
    if (b->held > 4) PyBuffer_Release(&b->os.view);
    if (b->held > 5) PyBuffer_Release(&b->oe.view);
}

static int get_binary(PyObject *args, Binary *b) {
    PyObject *o[6];
    b->held = 0;
    if (!PyArg_UnpackTuple(args, "binary", 6, 6, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5])) return -1;
    In *ins[] = {&b->as, &b->ae, &b->bs, &b->be};
    for (int i = 0; i < 4; i++) {
        if (get_in(o[i], ins[i]) < 0) return -1;
        b->held++;
    }
    if (get_out(o[4], &b->os) < 0) return -1;
    b->held++;
    if (get_out(o[5], &b->oe) < 0) return -1;
    b->held++;
    Py_ssize_t cap = b->os.cap < b->oe.cap ? b->os.cap : b->oe.cap;
    if (b->as.n != b->ae.n || b->bs.n != b->be.n || cap < b->as.n + b->bs.n) {
        PyErr_SetString(PyExc_ValueError, "mismatched interval columns or outputs too small");
        return -1;
    }
    return 0;
}

/* (a_s, a_e, b_s, b_e, out_s, out_e) -> OP's count, the buffers held and the GIL released. */
static PyObject *binary(PyObject *args, BinaryOp op) {
    Binary b;
    Py_ssize_t k = -1;
    if (get_binary(args, &b) == 0) {
        Sets sets = {b.as.at, b.ae.at, b.bs.at, b.be.at, b.as.n, b.bs.n,
                     b.os.cap < b.oe.cap ? b.os.cap : b.oe.cap, b.os.at, b.oe.at};
        Py_BEGIN_ALLOW_THREADS
        k = op(&sets);
        Py_END_ALLOW_THREADS
    }
    release_binary(&b);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(k);
}

static int nondecreasing(const int64_t *x, Py_ssize_t n) {
    for (Py_ssize_t i = 1; i < n; i++)
        if (x[i] < x[i - 1]) return 0;
    return 1;
}

/* ---- union -------------------------------------------------------------------------- */

static PyObject *py_union(PyObject *self, PyObject *args) {
    PyObject *o_s, *o_e, *o_mask, *o_os, *o_oe;
    if (!PyArg_UnpackTuple(args, "union", 5, 5, &o_s, &o_e, &o_mask, &o_os, &o_oe)) return NULL;
    In s = {0}, e = {0}, m = {0};
    Out os = {0}, oe = {0};
    int has_mask = o_mask != Py_None, got = 0;
    Py_ssize_t k = -1;
    if (get_in(o_s, &s) < 0) goto done;
    got = 1;
    if (get_in(o_e, &e) < 0) goto done;
    got = 2;
    if (has_mask) {
        if (PyObject_GetBuffer(o_mask, &m.view, PyBUF_C_CONTIGUOUS) < 0) goto done;
        m.n = m.view.len;
    }
    got = 3;
    if (get_out(o_os, &os) < 0) goto done;
    got = 4;
    if (get_out(o_oe, &oe) < 0) goto done;
    got = 5;
    /* Masked, the outputs need only hold the kept rows (the caller counts them): every
       write is checked against them, and -1 (the numpy path) answers when they fall short. */
    Py_ssize_t cap = os.cap < oe.cap ? os.cap : oe.cap;
    if (e.n != s.n || (has_mask && m.n != s.n) || (!has_mask && cap < s.n)) {
        PyErr_SetString(PyExc_ValueError, "mismatched interval columns or outputs too small");
        goto done;
    }
    {
        const int64_t *a = s.at, *b = e.at;
        const uint8_t *keep = has_mask ? (const uint8_t *)m.view.buf : NULL;
        int64_t *outs = os.at, *oute = oe.at;
        Py_ssize_t n = s.n;
        Py_BEGIN_ALLOW_THREADS
        Py_ssize_t i = 0, w = 0;
        if (keep)
            while (i < n && !keep[i]) i++;
        if (i < n) {
            int64_t start = a[i], end = b[i], last = a[i];
            for (i++; i < n; i++) {
                if (keep && !keep[i]) continue;
                int64_t si = a[i], ei = b[i];
                if (si < last) { w = -1; break; }
                last = si;
                if (si > end) {          /* past every earlier end: a new block */
                    if (w >= cap) { w = -1; break; }
                    outs[w] = start;
                    oute[w++] = end;
                    start = si;
                }
                if (ei > end) end = ei;    /* the running end of every interval so far */
            }
            if (w >= cap) w = -1;
            if (w >= 0) {
                outs[w] = start;
                oute[w++] = end;
            }
        }
        k = w;
        Py_END_ALLOW_THREADS
    }
done:
    if (got >= 5) PyBuffer_Release(&oe.view);
    if (got >= 4) PyBuffer_Release(&os.view);
    if (got >= 3 && has_mask) PyBuffer_Release(&m.view);
    if (got >= 2) PyBuffer_Release(&e.view);
    if (got >= 1) PyBuffer_Release(&s.view);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(k);
}

/* ---- merge_union -------------------------------------------------------------------- */

static Py_ssize_t merge_union(const Sets *x) {
    const int64_t *as = x->as, *ae = x->ae, *bs = x->bs, *be = x->be;
    Py_ssize_t na = x->na, nb = x->nb, i = 0, j = 0, w = 0;
    if (!nondecreasing(as, na) || !nondecreasing(bs, nb)) return -1;
    int open = 0;
    int64_t start = 0, end = 0;
    while (i < na || j < nb) {
        int64_t si, ei;
        /* B's interval first on equal starts: numpy.insert at searchsorted(left) */
        if (j >= nb || (i < na && as[i] < bs[j])) { si = as[i]; ei = ae[i++]; }
        else { si = bs[j]; ei = be[j++]; }
        if (!open) { start = si; end = ei; open = 1; continue; }
        if (si > end) { x->outs[w] = start; x->oute[w++] = end; start = si; }
        if (ei > end) end = ei;
    }
    if (open) { x->outs[w] = start; x->oute[w++] = end; }
    return w;
}

/* ---- intersect ---------------------------------------------------------------------- */

static Py_ssize_t intersect(const Sets *x) {
    const int64_t *as = x->as, *ae = x->ae, *bs = x->bs, *be = x->be;
    Py_ssize_t na = x->na, nb = x->nb, j0 = 0, w = 0;
    if (!nondecreasing(as, na) || !nondecreasing(bs, nb) || !nondecreasing(be, nb)) return -1;
    /* For each A interval, the B intervals from the first ending after its start to the last
     * starting before its end (searchsorted right on ends, left on starts). */
    for (Py_ssize_t i = 0; i < na; i++) {
        while (j0 < nb && be[j0] <= as[i]) j0++;
        for (Py_ssize_t j = j0; j < nb && bs[j] < ae[i]; j++) {
            int64_t s = as[i] > bs[j] ? as[i] : bs[j];
            int64_t e = ae[i] < be[j] ? ae[i] : be[j];
            if (e > s) {
                if (w >= x->cap) return -1;
                x->outs[w] = s;
                x->oute[w++] = e;
            }
        }
    }
    return w;
}

/* ---- subtract ----------------------------------------------------------------------- */

static Py_ssize_t subtract(const Sets *x) {
    const int64_t *as = x->as, *ae = x->ae, *bs = x->bs, *be = x->be;
    Py_ssize_t na = x->na, nb = x->nb, j0 = 0, w = 0;
    if (!nondecreasing(as, na) || !nondecreasing(ae, na)) return -1;
    for (Py_ssize_t j = 1; j < nb; j++)      /* B disjoint: each starts at or after the last end */
        if (bs[j] < be[j - 1] || be[j] < be[j - 1]) return -1;
    for (Py_ssize_t i = 0; i < na; i++) {
        int64_t cur = as[i];
        while (j0 < nb && be[j0] <= cur) j0++;
        for (Py_ssize_t j = j0; j < nb && bs[j] < ae[i]; j++) {
            if (be[j] <= bs[j] || be[j] <= cur) continue;   /* empty, or behind what is cut */
            if (bs[j] > cur) {
                if (w >= x->cap) return -1;
                x->outs[w] = cur;
                x->oute[w++] = bs[j];
            }
            cur = be[j];
        }
        if (cur < ae[i]) {
            if (w >= x->cap) return -1;
            x->outs[w] = cur;
            x->oute[w++] = ae[i];
        }
    }
    return w;
}

/* ---- cut ---------------------------------------------------------------------------- */

static Py_ssize_t cut(const Sets *x) {
    const int64_t *as = x->as, *ae = x->ae, *bs = x->bs, *be = x->be;
    Py_ssize_t na = x->na, nb = x->nb, i1 = 0, j1 = 0, i2 = 0, j2 = 0, w = 0;
    if (!nondecreasing(as, na) || !nondecreasing(ae, na) || !nondecreasing(bs, nb) || !nondecreasing(be, nb))
        return -1;
    /* Rank r of the merged starts (A starts, then B ends on ties: a stable sort of their
     * concatenation) pairs with rank r of the merged ends (A ends, then B starts). */
    for (Py_ssize_t r = 0; r < na + nb; r++) {
        int64_t s = (j1 >= nb || (i1 < na && as[i1] <= be[j1])) ? as[i1++] : be[j1++];
        int64_t e = (j2 >= nb || (i2 < na && ae[i2] <= bs[j2])) ? ae[i2++] : bs[j2++];
        if (e > s) {
            x->outs[w] = s;
            x->oute[w++] = e;
        }
    }
    return w;
}

static PyObject *py_merge_union(PyObject *self, PyObject *args) { return binary(args, merge_union); }
static PyObject *py_intersect(PyObject *self, PyObject *args) { return binary(args, intersect); }
static PyObject *py_subtract(PyObject *self, PyObject *args) { return binary(args, subtract); }
static PyObject *py_cut(PyObject *self, PyObject *args) { return binary(args, cut); }

/* ---- covered_before ----------------------------------------------------------------- */

static PyObject *py_covered_before(PyObject *self, PyObject *args) {
    PyObject *o[5];
    if (!PyArg_UnpackTuple(args, "covered_before", 5, 5, &o[0], &o[1], &o[2], &o[3], &o[4])) return NULL;
    In starts = {0}, cum = {0}, prev = {0}, times = {0};
    Out out = {0};
    In *ins[] = {&starts, &cum, &prev, &times};
    int got = 0;
    Py_ssize_t k = -1;
    for (; got < 4; got++)
        if (get_in(o[got], ins[got]) < 0) goto done;
    if (get_out(o[4], &out) < 0) goto done;
    got = 5;
    if (cum.n != starts.n + 1 || prev.n != starts.n + 1 || out.cap < times.n) {
        PyErr_SetString(PyExc_ValueError, "mismatched covered-length columns");
        goto done;
    }
    {
        const int64_t *s = starts.at, *c = cum.at, *pe = prev.at, *t = times.at;
        int64_t *w = out.at;
        Py_ssize_t n = starts.n, m = times.n;
        Py_BEGIN_ALLOW_THREADS
        Py_ssize_t lo = 0;
        int64_t last = 0;
        for (Py_ssize_t q = 0; q < m; q++) {
            int64_t x = t[q];
            /* upper bound of x in s: searched from the last answer while times rise */
            Py_ssize_t a = (q > 0 && x >= last) ? lo : 0, b = n;
            if (q > 0 && x >= last) {
                Py_ssize_t step = 1;
                while (a + step < n && s[a + step] <= x) { a += step; step <<= 1; }
                b = a + step < n ? a + step : n;
            }
            while (a < b) {
                Py_ssize_t mid = a + (b - a) / 2;
                if (s[mid] <= x) a = mid + 1; else b = mid;
            }
            lo = a;
            last = x;
            int64_t over = pe[a] - x;
            w[q] = c[a] - (over > 0 ? over : 0);
        }
        k = m;
        Py_END_ALLOW_THREADS
    }
done:
    if (got >= 5) PyBuffer_Release(&out.view);
    for (int i = 0; i < got && i < 4; i++) PyBuffer_Release(&ins[i]->view);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(k);
}

/* ---- chain_ends --------------------------------------------------------------------- */

static PyObject *py_chain_ends(PyObject *self, PyObject *args) {
    PyObject *o[3];
    if (!PyArg_UnpackTuple(args, "chain_ends", 3, 3, &o[0], &o[1], &o[2])) return NULL;
    In release = {0}, dur = {0};
    Out out = {0};
    int got = 0;
    Py_ssize_t k = -1;
    if (get_in(o[0], &release) < 0) goto done;
    got = 1;
    if (get_in(o[1], &dur) < 0) goto done;
    got = 2;
    if (get_out(o[2], &out) < 0) goto done;
    got = 3;
    if (dur.n != release.n || out.cap < release.n) {
        PyErr_SetString(PyExc_ValueError, "mismatched chain columns");
        goto done;
    }
    {
        const int64_t *r = release.at, *d = dur.at;
        int64_t *e = out.at;
        Py_ssize_t n = release.n;
        Py_BEGIN_ALLOW_THREADS
        int64_t end = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t from = (i == 0 || r[i] > end) ? r[i] : end;
            end = from + d[i];
            e[i] = end;
        }
        k = n;
        Py_END_ALLOW_THREADS
    }
done:
    if (got >= 3) PyBuffer_Release(&out.view);
    if (got >= 2) PyBuffer_Release(&dur.view);
    if (got >= 1) PyBuffer_Release(&release.view);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(k);
}

/* ---- pairwise_overlaps --------------------------------------------------------------- */

#define MAX_SETS 16

static PyObject *py_pairwise_overlaps(PyObject *self, PyObject *args) {
    PyObject *o_sets, *o_out;
    if (!PyArg_UnpackTuple(args, "pairwise_overlaps", 2, 2, &o_sets, &o_out)) return NULL;
    PyObject *seq = PySequence_Fast(o_sets, "sets must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq), got = 0;
    In starts[MAX_SETS], ends[MAX_SETS];
    Out out = {0};
    int have_out = 0;
    Py_ssize_t result = -1;
    if (k > MAX_SETS) {
        PyErr_SetString(PyExc_ValueError, "too many sets");
        goto done;
    }
    for (; got < k; got++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(seq, got), *a, *b;
        if (!PyArg_UnpackTuple(pair, "set", 2, 2, &a, &b)) goto done;
        if (get_in(a, &starts[got]) < 0) goto done;
        if (get_in(b, &ends[got]) < 0) { PyBuffer_Release(&starts[got].view); goto done; }
        if (starts[got].n != ends[got].n) {
            got++;
            PyErr_SetString(PyExc_ValueError, "mismatched interval columns");
            goto done;
        }
    }
    if (get_out(o_out, &out) < 0) goto done;
    have_out = 1;
    if (out.cap < k * k) {
        PyErr_SetString(PyExc_ValueError, "output too small");
        goto done;
    }
    {
        int64_t *table = out.at;
        int64_t *by_mask = calloc((size_t)1 << k, sizeof(int64_t));
        if (!by_mask) { PyErr_NoMemory(); goto done; }
        Py_BEGIN_ALLOW_THREADS
        Py_ssize_t at[MAX_SETS] = {0};   /* per set: its next boundary, 2 per interval */
        Py_ssize_t open[MAX_SETS] = {0}; /* per set: its intervals begun and not ended (touching
                                          * pieces and empty ones overlap at a shared time) */
        uint32_t mask = 0;
        int64_t previous = 0;
        int first = 1;
        for (;;) {
            /* the earliest next boundary (the segments between boundaries at one time are
             * empty, so their order there changes no length) */
            int best = -1, best_end = 0;
            int64_t best_time = 0;
            for (Py_ssize_t i = 0; i < k; i++) {
                if (at[i] >= 2 * starts[i].n) continue;
                int is_end = (int)(at[i] & 1);
                int64_t t = is_end ? ends[i].at[at[i] >> 1] : starts[i].at[at[i] >> 1];
                if (best < 0 || t < best_time || (t == best_time && is_end < best_end)) {
                    best = (int)i;
                    best_time = t;
                    best_end = is_end;
                }
            }
            if (best < 0) break;
            if (!first) by_mask[mask] += best_time - previous;
            first = 0;
            previous = best_time;
            open[best] += best_end ? -1 : 1;
            if (open[best] > 0) mask |= 1u << best; else mask &= ~(1u << best);
            at[best]++;
        }
        for (Py_ssize_t i = 0; i < k * k; i++) table[i] = 0;
        for (uint32_t m = 1; m < ((uint32_t)1 << k); m++) {
            if (!by_mask[m]) continue;
            for (Py_ssize_t i = 0; i < k; i++) {
                if (!(m >> i & 1)) continue;
                for (Py_ssize_t j = 0; j < k; j++)
                    if (m >> j & 1) table[i * k + j] += by_mask[m];
            }
        }
        Py_END_ALLOW_THREADS
        free(by_mask);
        result = k;
    }
done:
    if (have_out) PyBuffer_Release(&out.view);
    for (Py_ssize_t i = 0; i < got; i++) {
        PyBuffer_Release(&starts[i].view);
        PyBuffer_Release(&ends[i].view);
    }
    Py_DECREF(seq);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromSsize_t(result);
}

static PyMethodDef methods[] = {
    {"union", py_union, METH_VARARGS, "Merge intervals sorted by start (optionally masked rows)."},
    {"merge_union", py_merge_union, METH_VARARGS, "Union of two sets' intervals, each sorted by start."},
    {"intersect", py_intersect, METH_VARARGS, "Intersection of two disjoint sorted sets."},
    {"subtract", py_subtract, METH_VARARGS, "A minus B for disjoint sorted sets."},
    {"cut", py_cut, METH_VARARGS, "A minus a subset B of it, by rank-wise pairing of merged bounds."},
    {"covered_before", py_covered_before, METH_VARARGS, "Covered length of a disjoint set before each time."},
    {"chain_ends", py_chain_ends, METH_VARARGS, "end[i] = max(release[i], end[i-1]) + d[i]."},
    {"pairwise_overlaps", py_pairwise_overlaps, METH_VARARGS, "Overlap of every pair of up to 16 disjoint sets."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_intervals",
                                    "One-pass interval algebra on sorted int64 sets.", -1, methods};

PyMODINIT_FUNC PyInit__intervals(void) { return PyModule_Create(&module); }
