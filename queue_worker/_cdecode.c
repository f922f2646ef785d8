/* The claims log's common records decoded in C (see queue_worker/cdecode.py).

   decode_claims_all(datas, Claim, Done, fallback) -> list
       records.decode_claims_all for a read's payloads, building records.py's own types
   decode_claims_entries(entries, Claim, Done, fallback) -> (records, positions, stamped)
       records.decode_claims_entries: the same for a read's entries (a list of tuples
       (position, next, data, server_time_us)), with their positions, and whether any
       carries a server time
   decode_claims_frames(buf, max_record, verified, limit, base, Claim, Done, fallback)
       -> (records, positions, pos, batch_start, ready): a span of a file log's frames,
       walked and checked as logstore.framing._decode_loop walks them, each payload decoded
       where it lies (see below): a fold reader's read with no Entry and no payload copy

   `records.py` stays the definition of the records and their errors. This file knows the
   two records a drain writes, well formed and packed as msgpack packs them:

       CLAIM  fixarray(6) [version, "C", task, worker, at, lease]
       DONE   fixarray(7) [version, "D", task, worker, at, claim, result]

   version a positive fixint >= 1, "C"/"D" a one-byte fixstr, task an integer from 0 to
   2^63-1, worker a str (strict UTF-8), at/lease/claim integers, result nil, a bool, an
   integer, a float64 or a str, and nothing after the array. It builds them as `decode` does
   (tuple.__new__(Claim, ...)). A payload it does not recognise exactly, however valid, is
   handed to `fallback` (records._claims_or_none: decode_claims, None when malformed), so
   every other record and every error is the Python's. No rule of the fold is here.
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../logstore/_framewalk.h"

/* What a call builds with (records.py's types, its fallback): arguments, not module state,
   so that a second copy of records.py (the tests load one) cannot change the first's. */
typedef struct {
    PyTypeObject *claim;
    PyTypeObject *done;
} types;

/* A read's records name a few workers again and again: one str object each (its hash is
   then computed once, by the fold's first dict lookup, not once a record). */
#define WORKER_CACHE 16
typedef struct {
    const char *utf8; /* the str's own UTF-8 (what strict decoding read, byte for byte) */
    Py_ssize_t size;
    PyObject *str; /* a reference of the cache's own, released at the end of the call */
} cached_str;

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
} reader;

static int
need(reader *r, Py_ssize_t n)
{
    return r->end - r->p >= n;
}

static uint64_t
be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* An msgpack integer (any of its encodings) as a new Python int; NULL with no error set
   when the next item is not an integer or is cut short. `nonneg` rejects negatives. */
static PyObject *
read_int(reader *r, int nonneg)
{
    if (!need(r, 1))
        return NULL;
    unsigned char b = *r->p;
    if (b <= 0x7f) {
        r->p += 1;
        return PyLong_FromLong(b);
    }
    if (b >= 0xe0) {
        if (nonneg)
            return NULL;
        r->p += 1;
        return PyLong_FromLong((long)(int8_t)b);
    }
    int n;
    int is_signed;
    switch (b) {
    case 0xcc: n = 1; is_signed = 0; break;
    case 0xcd: n = 2; is_signed = 0; break;
    case 0xce: n = 4; is_signed = 0; break;
    case 0xcf: n = 8; is_signed = 0; break;
    case 0xd0: n = 1; is_signed = 1; break;
    case 0xd1: n = 2; is_signed = 1; break;
    case 0xd2: n = 4; is_signed = 1; break;
    case 0xd3: n = 8; is_signed = 1; break;
    default: return NULL;
    }
    if (!need(r, 1 + n))
        return NULL;
    uint64_t v = be(r->p + 1, n);
    if (is_signed) {
        int64_t s;
        if (n == 1) s = (int8_t)v;
        else if (n == 2) s = (int16_t)v;
        else if (n == 4) s = (int32_t)v;
        else s = (int64_t)v;
        if (nonneg && s < 0)
            return NULL;
        r->p += 1 + n;
        return PyLong_FromLongLong(s);
    }
    if (nonneg && v > (uint64_t)INT64_MAX) /* a task id beyond MAX_TASK_ID */
        return NULL;
    r->p += 1 + n;
    return PyLong_FromUnsignedLongLong(v);
}

/* An msgpack str's bytes; 0 when the next item is not a str or is cut short. */
static int
read_str(reader *r, const char **bytes, Py_ssize_t *size)
{
    if (!need(r, 1))
        return 0;
    unsigned char b = *r->p;
    Py_ssize_t head, n;
    if ((b & 0xe0) == 0xa0) {
        head = 1;
        n = b & 0x1f;
    } else if (b == 0xd9 && need(r, 2)) {
        head = 2;
        n = (Py_ssize_t)be(r->p + 1, 1);
    } else if (b == 0xda && need(r, 3)) {
        head = 3;
        n = (Py_ssize_t)be(r->p + 1, 2);
    } else if (b == 0xdb && need(r, 5)) {
        head = 5;
        n = (Py_ssize_t)be(r->p + 1, 4);
    } else {
        return 0;
    }
    if (r->end - r->p - head < n)
        return 0;
    *bytes = (const char *)r->p + head;
    *size = n;
    r->p += head + n;
    return 1;
}

/* A str as msgpack decodes it (raw=False: strict UTF-8); NULL with no error set when it
   is not valid UTF-8 (msgpack would raise: the fallback says so). */
static PyObject *
make_str(const char *bytes, Py_ssize_t size)
{
    PyObject *s = PyUnicode_DecodeUTF8(bytes, size, "strict");
    if (s == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
        PyErr_Clear();
    return s;
}

static PyObject *
worker_str(reader *r, cached_str *cache, int *cached)
{
    const char *bytes;
    Py_ssize_t size;
    if (!read_str(r, &bytes, &size))
        return NULL;
    for (int i = 0; i < *cached; i++) {
        if (cache[i].size == size && memcmp(cache[i].utf8, bytes, (size_t)size) == 0) {
            Py_INCREF(cache[i].str);
            return cache[i].str;
        }
    }
    PyObject *s = make_str(bytes, size);
    if (s != NULL && *cached < WORKER_CACHE) {
        Py_ssize_t utf8_size;
        const char *utf8 = PyUnicode_AsUTF8AndSize(s, &utf8_size);
        if (utf8 == NULL) {
            Py_DECREF(s);
            return NULL; /* memory: the error stays set */
        }
        Py_INCREF(s);
        cache[*cached].utf8 = utf8;
        cache[*cached].size = utf8_size;
        cache[*cached].str = s;
        (*cached)++;
    }
    return s;
}

/* A DONE's result when it is a scalar msgpack decodes without options; else NULL, no
   error set (the fallback decodes it). */
static PyObject *
read_result(reader *r)
{
    if (!need(r, 1))
        return NULL;
    unsigned char b = *r->p;
    if (b == 0xc0) {
        r->p += 1;
        Py_RETURN_NONE;
    }
    if (b == 0xc2 || b == 0xc3) {
        r->p += 1;
        return PyBool_FromLong(b == 0xc3);
    }
    if (b == 0xcb && need(r, 9)) {
        uint64_t bits = be(r->p + 1, 8);
        double d;
        memcpy(&d, &bits, sizeof d);
        r->p += 9;
        return PyFloat_FromDouble(d);
    }
    const char *bytes;
    Py_ssize_t size;
    reader probe = *r;
    if (read_str(&probe, &bytes, &size)) {
        PyObject *s = make_str(bytes, size);
        if (s != NULL)
            *r = probe;
        return s;
    }
    return read_int(r, 0);
}

/* The record `data` encodes when it is one this file knows; NULL otherwise, with an error
   set only for a real failure (memory), never for the bytes. */
static PyObject *
decode_span(const unsigned char *data, Py_ssize_t size, const types *t, cached_str *cache,
            int *cached)
{
    reader r;
    r.p = data;
    r.end = data + size;
    if (!need(&r, 4))
        return NULL;
    unsigned char array = r.p[0], version = r.p[1], str1 = r.p[2], code = r.p[3];
    if (version < 1 || version > 0x7f || str1 != 0xa1)
        return NULL;
    PyTypeObject *type;
    Py_ssize_t fields;
    if (array == 0x96 && code == 'C') {
        type = t->claim;
        fields = 4;
    } else if (array == 0x97 && code == 'D') {
        type = t->done;
        fields = 5;
    } else {
        return NULL;
    }
    r.p += 4;
    PyObject *items[5] = {NULL, NULL, NULL, NULL, NULL};
    items[0] = read_int(&r, 1);
    if (items[0] == NULL)
        goto fail;
    items[1] = worker_str(&r, cache, cached);
    if (items[1] == NULL)
        goto fail;
    items[2] = read_int(&r, 0);
    if (items[2] == NULL)
        goto fail;
    items[3] = read_int(&r, 0);
    if (items[3] == NULL)
        goto fail;
    if (fields == 5) {
        items[4] = read_result(&r);
        if (items[4] == NULL)
            goto fail;
    }
    if (r.p != r.end) /* anything after the array: not one msgpack object */
        goto fail;
    /* tuple.__new__(type, items): what tuple's own subtype constructor does */
    PyObject *record = type->tp_alloc(type, fields);
    if (record == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < fields; i++)
        PyTuple_SET_ITEM(record, i, items[i]);
    return record;
fail:
    for (int i = 0; i < 5; i++)
        Py_XDECREF(items[i]);
    return NULL;
}

static PyObject *
decode_known(PyObject *data, const types *t, cached_str *cache, int *cached)
{
    return decode_span((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data),
                       t, cache, cached);
}

static void
release(cached_str *cache, int cached)
{
    for (int i = 0; i < cached; i++)
        Py_DECREF(cache[i].str);
}

static int
is_tuple_type(PyObject *o)
{
    return PyType_Check(o) && PyType_IsSubtype((PyTypeObject *)o, &PyTuple_Type);
}

static PyObject *
decode_claims_all(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "decode_claims_all(datas, Claim, Done, fallback)");
        return NULL;
    }
    PyObject *datas = args[0], *fallback = args[3];
    if (!is_tuple_type(args[1]) || !is_tuple_type(args[2]) || !PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError,
                        "decode_claims_all: Claim and Done must be tuple types, fallback callable");
        return NULL;
    }
    types t = {(PyTypeObject *)args[1], (PyTypeObject *)args[2]};
    PyObject *iterator = PyObject_GetIter(datas);
    if (iterator == NULL)
        return NULL;
    PyObject *records = PyList_New(0);
    if (records == NULL) {
        Py_DECREF(iterator);
        return NULL;
    }
    cached_str cache[WORKER_CACHE];
    int cached = 0;
    PyObject *data;
    while ((data = PyIter_Next(iterator)) != NULL) {
        PyObject *record = NULL;
        if (PyBytes_CheckExact(data)) {
            record = decode_known(data, &t, cache, &cached);
            if (record == NULL && PyErr_Occurred()) {
                Py_DECREF(data);
                goto error;
            }
        }
        if (record == NULL) {
            record = PyObject_CallOneArg(fallback, data);
            if (record == NULL) {
                Py_DECREF(data);
                goto error;
            }
        }
        int failed = PyList_Append(records, record);
        Py_DECREF(record);
        if (failed) {
            Py_DECREF(data);
            goto error;
        }
        Py_DECREF(data);
    }
    if (PyErr_Occurred())
        goto error;
    Py_DECREF(iterator);
    release(cache, cached);
    return records;
error:
    Py_DECREF(iterator);
    Py_DECREF(records);
    release(cache, cached);
    return NULL;
}

static PyObject *
decode_claims_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "decode_claims_entries(entries, Claim, Done, fallback)");
        return NULL;
    }
    PyObject *entries = args[0], *fallback = args[3];
    if (!PyList_CheckExact(entries) || !is_tuple_type(args[1]) || !is_tuple_type(args[2])
        || !PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "decode_claims_entries: entries must be a list, Claim "
                                         "and Done tuple types, fallback callable");
        return NULL;
    }
    types t = {(PyTypeObject *)args[1], (PyTypeObject *)args[2]};
    Py_ssize_t count = PyList_GET_SIZE(entries);
    PyObject *records = PyList_New(count), *positions = PyList_New(count);
    cached_str cache[WORKER_CACHE];
    int cached = 0, stamped = 0;
    if (records == NULL || positions == NULL)
        goto error;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *entry = PyList_GET_ITEM(entries, i);
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) < 4) {
            PyErr_SetString(PyExc_TypeError, "decode_claims_entries: an entry is not a tuple "
                                             "(position, next, data, server_time_us)");
            goto error;
        }
        /* the entry held, and the list's length checked: the fallback may run any code */
        Py_INCREF(entry);
        PyObject *data = PyTuple_GET_ITEM(entry, 2);
        PyObject *record = NULL;
        if (PyBytes_CheckExact(data)) {
            record = decode_known(data, &t, cache, &cached);
            if (record == NULL && PyErr_Occurred()) {
                Py_DECREF(entry);
                goto error;
            }
        }
        if (record == NULL)
            record = PyObject_CallOneArg(fallback, data);
        if (record == NULL) {
            Py_DECREF(entry);
            goto error;
        }
        PyList_SET_ITEM(records, i, record);
        PyObject *position = PyTuple_GET_ITEM(entry, 0);
        Py_INCREF(position);
        PyList_SET_ITEM(positions, i, position);
        if (PyTuple_GET_ITEM(entry, 3) != Py_None)
            stamped = 1;
        Py_DECREF(entry);
        if (PyList_GET_SIZE(entries) != count) {
            PyErr_SetString(PyExc_RuntimeError, "decode_claims_entries: the entries changed");
            goto error;
        }
    }
    release(cache, cached);
    return Py_BuildValue("(NNO)", records, positions, stamped ? Py_True : Py_False);
error:
    Py_XDECREF(records);
    Py_XDECREF(positions);
    release(cache, cached);
    return NULL;
}

/* decode_claims_frames: the state of a walk (see _framewalk.h's keeper) */
typedef struct {
    PyObject *records;
    PyObject *positions;
    long long base;
    types t;
    PyObject *fallback;
    cached_str *cache;
    int *cached;
} span_state;

static int
keep_record(void *state, long long pos, long long end, const unsigned char *data,
            long long length)
{
    span_state *s = (span_state *)state;
    PyObject *record = decode_span(data, (Py_ssize_t)length, &s->t, s->cache, s->cached);
    if (record == NULL) {
        if (PyErr_Occurred())
            return -1;
        /* not one this file knows: the payload, as bytes, to the Python (records.py) */
        PyObject *payload = PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)length);
        if (payload == NULL)
            return -1;
        record = PyObject_CallOneArg(s->fallback, payload);
        Py_DECREF(payload);
        if (record == NULL)
            return -1;
    }
    int failed = PyList_Append(s->records, record);
    Py_DECREF(record);
    if (failed)
        return -1;
    PyObject *position = PyLong_FromLongLong(s->base + pos);
    if (position == NULL)
        return -1;
    failed = PyList_Append(s->positions, position);
    Py_DECREF(position);
    return failed;
}

/* decode_claims_frames(buf, max_record, verified, limit, base, Claim, Done, fallback)
       -> (records, positions, pos, batch_start, ready)

   logstore.framing._decode_loop's walk over the frames of `buf` (bytes; the same checks, in
   the same code: _framewalk.h), each payload decoded where it lies as decode_claims_all
   decodes it (a record, or the fallback's answer for one this file does not know), each
   frame's offset made absolute (`base` + offset). `records.decode_claims_frames_py` is its
   definition. The file log's span read (FileLog.read_span) decides the rest (torn, damaged,
   corrupt) from pos, batch_start and ready, as it does for entries. */
static PyObject *
decode_claims_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "decode_claims_frames(buf, max_record, verified, limit, "
                                         "base, Claim, Done, fallback)");
        return NULL;
    }
    PyObject *buf = args[0], *fallback = args[7];
    if (!PyBytes_CheckExact(buf) || !is_tuple_type(args[5]) || !is_tuple_type(args[6])
        || !PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "decode_claims_frames: buf must be bytes, Claim and "
                                         "Done tuple types, fallback callable");
        return NULL;
    }
    long long numbers[4];
    for (int i = 0; i < 4; i++) {
        numbers[i] = PyLong_AsLongLong(args[1 + i]);
        if (numbers[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    cached_str cache[WORKER_CACHE];
    int cached = 0;
    span_state state = {PyList_New(0), PyList_New(0), numbers[3],
                        {(PyTypeObject *)args[5], (PyTypeObject *)args[6]}, fallback, cache,
                        &cached};
    long long pos, batch_start, ready;
    /* buf is held by the caller's arguments: the fallback cannot free it */
    if (state.records == NULL || state.positions == NULL
        || frame_walk(buf, numbers[0], numbers[1], numbers[2], keep_record, &state, &pos,
                      &batch_start, &ready) < 0) {
        Py_XDECREF(state.records);
        Py_XDECREF(state.positions);
        release(cache, cached);
        return NULL;
    }
    release(cache, cached);
    return Py_BuildValue("(NNLLL)", state.records, state.positions, pos, batch_start, ready);
}

static PyMethodDef methods[] = {
    {"decode_claims_frames", (PyCFunction)(void (*)(void))decode_claims_frames, METH_FASTCALL,
     "records.decode_claims_frames_py, in C."},
    {"decode_claims_all", (PyCFunction)(void (*)(void))decode_claims_all, METH_FASTCALL,
     "records.decode_claims_all, in C."},
    {"decode_claims_entries", (PyCFunction)(void (*)(void))decode_claims_entries, METH_FASTCALL,
     "records.decode_claims_entries, in C."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "queue_worker._cdecode", "The claims records decoded in C.", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__cdecode(void)
{
    return PyModule_Create(&module);
}
