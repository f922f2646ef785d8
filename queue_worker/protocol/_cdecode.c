/* The claims log's common records decoded in C (see queue_worker/protocol/cdecode.py).

   decode_claims_all(datas, Claim, Done, fallback) -> list
       records.decode_claims_all for a read's payloads, building records.py's own types
   decode_claims_entries(entries, Claim, Done, fallback) -> (records, positions, stamped)
       records.decode_claims_entries: the same for a read's entries (a list of tuples
       (position, next, data, server_time_us)), with their positions, and whether any
       carries a server time
   decode_claims_frames(buf, max_record, verified, limit, base, Claim, Done, fallback)
       -> (records, positions, pos, batch_start, ready): a span of a file log's frames,
       walked and checked as logstore.file.framing._decode_loop walks them, each payload decoded
       where it lies (see below): a fold reader's read with no Entry and no payload copy

   `records.py` stays the definition of the records and their errors. This file knows the
   two records a drain writes, well formed and packed as msgpack packs them:

       CLAIM  fixarray(6) [version, "C", task, worker, at, lease]
       DONE   fixarray(7) [version, "D", task, worker, at, claim, result]

   version a positive fixint >= 1, "C"/"D" a one-byte fixstr, task an integer from 0 to
   2^63-1, worker a str (strict UTF-8), at/lease/claim integers, result any msgpack value
   but an ext (nil, a bool, an integer, a float, a str, a bin, an array, a map keyed by str
   or bin: what msgpack.unpackb gives with its defaults, nested at most MAX_DEPTH deep), and
   nothing after the array. It builds them as `decode` does (tuple.__new__(Claim, ...)). A
   payload it does not recognise exactly, however valid, is handed to `fallback`
   (records._claims_or_none: decode_claims, None when malformed), so every other record and
   every error is the Python's. No rule of the fold is here.

   decode_claims_frames(..., fallback, task, other): the same, for a reader of one task's
   records (`qw why`, `qw task`: queue_worker.proof.log_reading.read_claims_batches with a task):
   a payload that cannot be a record of `task` (an array whose third item, a claims
   record's task, is an integer other than `task`) is not decoded: `other` stands in its
   place. Any other payload is decoded as above. without(items, positions, other) then
   leaves those places out.

   task_frames(buf, max_record, verified, limit, base, prefix, known): the same walk over a
   tasks log's frames, for a counter of its records (`qw status`): a payload beginning with
   `prefix` is `known`, any other its bytes (nothing is decoded).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_framewalk.h"

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

/* A call's caches: its workers' names, and the keys of its results' maps (a drain's
   results repeat a few keys: {"task": ..., "worked_ms": ...}). */
typedef struct {
    cached_str worker[WORKER_CACHE];
    int workers;
    cached_str key[WORKER_CACHE];
    int keys;
} strings;

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

/* The str of `bytes` from `cache` (or made, and kept there while it has room); NULL with
   no error set when it is not valid UTF-8. `intern`: interned, as msgpack interns a map's
   keys. */
static PyObject *
cached_text(const char *bytes, Py_ssize_t size, cached_str *cache, int *cached, int intern)
{
    for (int i = 0; i < *cached; i++) {
        if (cache[i].size == size && memcmp(cache[i].utf8, bytes, (size_t)size) == 0) {
            Py_INCREF(cache[i].str);
            return cache[i].str;
        }
    }
    PyObject *s = make_str(bytes, size);
    if (s == NULL)
        return NULL;
    if (intern)
        PyUnicode_InternInPlace(&s);
    if (*cached < WORKER_CACHE) {
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

static PyObject *
worker_str(reader *r, strings *cache)
{
    const char *bytes;
    Py_ssize_t size;
    if (!read_str(r, &bytes, &size))
        return NULL;
    return cached_text(bytes, size, cache->worker, &cache->workers, 0);
}

/* How deep a DONE's result may nest (arrays, maps) to be built here: a deeper one goes to
   the fallback (msgpack's own limit is far deeper; no result of ours comes near either). */
#define MAX_DEPTH 32

static PyObject *read_value(reader *r, strings *cache, int depth);

/* The length of an msgpack container or bin whose head is `b` at r->p (1, 2 or 4 bytes
   after it), moving past the head; -1 when cut short. */
static Py_ssize_t
read_length(reader *r, int n)
{
    if (!need(r, 1 + n))
        return -1;
    Py_ssize_t size = (Py_ssize_t)be(r->p + 1, n);
    r->p += 1 + n;
    return size;
}

static PyObject *
read_array(reader *r, Py_ssize_t count, strings *cache, int depth)
{
    if (count > r->end - r->p) /* each item takes a byte at least: cut short */
        return NULL;
    PyObject *list = PyList_New(count);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = read_value(r, cache, depth + 1);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

/* A map's key: a str (one object for each text a call meets, interned as msgpack interns
   it) or a bin; NULL, no error set, for any other key (msgpack's strict_map_key refuses
   it, and the fallback decodes again without). */
static PyObject *
read_key(reader *r, strings *cache)
{
    if (!need(r, 1))
        return NULL;
    unsigned char b = *r->p;
    if (b == 0xc4 || b == 0xc5 || b == 0xc6)
        return read_value(r, cache, MAX_DEPTH); /* a bin: bytes */
    const char *bytes;
    Py_ssize_t size;
    reader probe = *r;
    if (!read_str(&probe, &bytes, &size))
        return NULL;
    PyObject *key = cached_text(bytes, size, cache->key, &cache->keys, 1);
    if (key != NULL)
        *r = probe;
    return key;
}

static PyObject *
read_map(reader *r, Py_ssize_t count, strings *cache, int depth)
{
    if (count > (r->end - r->p) / 2) /* each pair takes two bytes at least: cut short */
        return NULL;
    PyObject *map = PyDict_New();
    if (map == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = read_key(r, cache);
        if (key == NULL) {
            Py_DECREF(map);
            return NULL;
        }
        PyObject *value = read_value(r, cache, depth + 1);
        /* a key given twice: the later value in the earlier place, as msgpack's dict has it */
        int failed = value == NULL || PyDict_SetItem(map, key, value) < 0;
        Py_DECREF(key);
        Py_XDECREF(value);
        if (failed) {
            Py_DECREF(map);
            return NULL;
        }
    }
    return map;
}

/* A DONE's result (or an item of it) as msgpack.unpackb decodes it with its defaults: nil,
   bools, integers, floats, str (strict UTF-8), bin as bytes, arrays as lists, maps keyed
   by str or bin as dicts. NULL with no error set for anything else (an ext, a key of
   another type, a bad str, a value cut short, nesting beyond MAX_DEPTH): the fallback
   decodes the whole payload. NULL with an error set only for a real failure (memory). */
static PyObject *
read_value(reader *r, strings *cache, int depth)
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
    if (b == 0xca && need(r, 5)) {
        uint32_t bits = (uint32_t)be(r->p + 1, 4);
        float f;
        memcpy(&f, &bits, sizeof f);
        r->p += 5;
        return PyFloat_FromDouble((double)f);
    }
    if (b == 0xc4 || b == 0xc5 || b == 0xc6) { /* bin 8/16/32: bytes */
        reader probe = *r;
        Py_ssize_t size = read_length(&probe, b == 0xc4 ? 1 : b == 0xc5 ? 2 : 4);
        if (size < 0 || size > probe.end - probe.p)
            return NULL;
        PyObject *data = PyBytes_FromStringAndSize((const char *)probe.p, size);
        if (data != NULL)
            r->p = probe.p + size;
        return data;
    }
    int is_array = (b & 0xf0) == 0x90 || b == 0xdc || b == 0xdd;
    int is_map = (b & 0xf0) == 0x80 || b == 0xde || b == 0xdf;
    if (is_array || is_map) {
        if (depth >= MAX_DEPTH)
            return NULL;
        reader probe = *r;
        Py_ssize_t count;
        if (b < 0xa0) {
            count = b & 0x0f;
            probe.p += 1;
        } else {
            count = read_length(&probe, b == 0xdc || b == 0xde ? 2 : 4);
            if (count < 0)
                return NULL;
        }
        PyObject *value = is_array ? read_array(&probe, count, cache, depth)
                                   : read_map(&probe, count, cache, depth);
        if (value != NULL)
            *r = probe;
        return value;
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
decode_span(const unsigned char *data, Py_ssize_t size, const types *t, strings *cache)
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
    items[1] = worker_str(&r, cache);
    if (items[1] == NULL)
        goto fail;
    items[2] = read_int(&r, 0);
    if (items[2] == NULL)
        goto fail;
    items[3] = read_int(&r, 0);
    if (items[3] == NULL)
        goto fail;
    if (fields == 5) {
        items[4] = read_value(&r, cache, 0);
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
decode_known(PyObject *data, const types *t, strings *cache)
{
    return decode_span((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data),
                       t, cache);
}

static void
release(strings *cache)
{
    for (int i = 0; i < cache->workers; i++)
        Py_DECREF(cache->worker[i].str);
    for (int i = 0; i < cache->keys; i++)
        Py_DECREF(cache->key[i].str);
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
    strings cache;
    cache.workers = cache.keys = 0;
    PyObject *data;
    while ((data = PyIter_Next(iterator)) != NULL) {
        PyObject *record = NULL;
        if (PyBytes_CheckExact(data)) {
            record = decode_known(data, &t, &cache);
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
    release(&cache);
    return records;
error:
    Py_DECREF(iterator);
    Py_DECREF(records);
    release(&cache);
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
    strings cache;
    int stamped = 0;
    cache.workers = cache.keys = 0;
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
            record = decode_known(data, &t, &cache);
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
    release(&cache);
    return Py_BuildValue("(NNO)", records, positions, stamped ? Py_True : Py_False);
error:
    Py_XDECREF(records);
    Py_XDECREF(positions);
    release(&cache);
    return NULL;
}

/* decode_claims_frames: the state of a walk (see _framewalk.h's keeper) */
typedef struct {
    PyObject *records;
    PyObject *positions;
    long long base;
    types t;
    PyObject *fallback;
    strings *cache;
    PyObject *other; /* NULL: every payload decoded; else what stands for another task's */
    uint64_t task;
} span_state;

/* Whether the payload `data` cannot be a record of `task`: an msgpack array of three items
   or more whose first is an integer, second a str and third an integer other than `task`.
   (records.py reads a claims record's task from its third item; whatever the rest, such a
   payload is another task's record, or malformed, or of a type this version does not
   know.) 0 whenever in doubt: the payload is then decoded. */
/* An msgpack integer's magnitude and sign, moving past it; 0 when the next item is not an
   integer or is cut short. (Nothing is built: see read_int for one as a Python int.) */
static int
skip_int(reader *r, uint64_t *value, int *negative)
{
    if (!need(r, 1))
        return 0;
    unsigned char b = *r->p;
    if (b <= 0x7f || b >= 0xe0) {
        *value = b;
        *negative = b >= 0xe0;
        r->p += 1;
        return 1;
    }
    int n;
    switch (b) {
    case 0xcc: case 0xd0: n = 1; break;
    case 0xcd: case 0xd1: n = 2; break;
    case 0xce: case 0xd2: n = 4; break;
    case 0xcf: case 0xd3: n = 8; break;
    default: return 0;
    }
    if (!need(r, 1 + n))
        return 0;
    *value = be(r->p + 1, n);
    *negative = b >= 0xd0 && (r->p[1] & 0x80); /* a signed encoding's sign bit */
    r->p += 1 + n;
    return 1;
}

static int
other_task(const unsigned char *data, Py_ssize_t size, uint64_t task)
{
    reader r;
    r.p = data;
    r.end = data + size;
    if (!need(&r, 1))
        return 0;
    unsigned char b = *r.p;
    Py_ssize_t count;
    if ((b & 0xf0) == 0x90) {
        count = b & 0x0f;
        r.p += 1;
    } else if (b == 0xdc || b == 0xdd) {
        count = read_length(&r, b == 0xdc ? 2 : 4);
    } else {
        return 0;
    }
    const char *code;
    Py_ssize_t length;
    uint64_t value;
    int negative;
    if (count < 3 || !skip_int(&r, &value, &negative) || !read_str(&r, &code, &length)
        || !skip_int(&r, &value, &negative))
        return 0;
    return negative || value != task;
}

/* Append `item` (a reference this steals) to `items` and its absolute `position` to
   `positions`: what a span loop keeps of each record. 0, or -1 with an exception set. */
static int
append_at(PyObject *items, PyObject *positions, PyObject *item, long long position)
{
    int failed = PyList_Append(items, item);
    Py_DECREF(item);
    if (failed)
        return -1;
    PyObject *number = PyLong_FromLongLong(position);
    if (number == NULL)
        return -1;
    failed = PyList_Append(positions, number);
    Py_DECREF(number);
    return failed;
}

static int
keep_record(void *state, long long pos, long long end, const unsigned char *data,
            long long length)
{
    span_state *s = (span_state *)state;
    PyObject *record;
    if (s->other != NULL && other_task(data, (Py_ssize_t)length, s->task)) {
        record = s->other;
        Py_INCREF(record);
    } else {
        record = decode_span(data, (Py_ssize_t)length, &s->t, s->cache);
    }
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
    return append_at(s->records, s->positions, record, s->base + pos);
}

/* decode_claims_frames(buf, max_record, verified, limit, base, Claim, Done, fallback
                        [, task, other])
       -> (records, positions, pos, batch_start, ready)

   logstore.file.framing._decode_loop's walk over the frames of `buf` (bytes; the same checks, in
   the same code: _framewalk.h), each payload decoded where it lies as decode_claims_all
   decodes it (a record, or the fallback's answer for one this file does not know), each
   frame's offset made absolute (`base` + offset). `records.decode_claims_frames_py` is its
   definition. The file log's span read (FileLog.read_span) decides the rest (torn, damaged,
   corrupt) from pos, batch_start and ready, as it does for entries. With `task` (a task
   id) and `other` (any object), a payload that cannot be a record of that task is `other`,
   not decoded (`other_task`). */
static PyObject *
decode_claims_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8 && nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "decode_claims_frames(buf, max_record, verified, limit, "
                                         "base, Claim, Done, fallback[, task, other])");
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
    uint64_t task = 0;
    if (nargs == 10) {
        long long id = PyLong_AsLongLong(args[8]);
        if (id == -1 && PyErr_Occurred())
            return NULL;
        if (id < 0) {
            PyErr_SetString(PyExc_ValueError, "decode_claims_frames: task must be a task id");
            return NULL;
        }
        task = (uint64_t)id;
    }
    strings cache;
    cache.workers = cache.keys = 0;
    span_state state = {PyList_New(0),
                        PyList_New(0),
                        numbers[3],
                        {(PyTypeObject *)args[5], (PyTypeObject *)args[6]},
                        fallback,
                        &cache,
                        nargs == 10 ? args[9] : NULL,
                        task};
    long long pos, batch_start, ready;
    /* buf is held by the caller's arguments: the fallback cannot free it */
    if (state.records == NULL || state.positions == NULL
        || frame_walk(buf, numbers[0], numbers[1], numbers[2], keep_record, &state, &pos,
                      &batch_start, &ready) < 0) {
        Py_XDECREF(state.records);
        Py_XDECREF(state.positions);
        release(&cache);
        return NULL;
    }
    release(&cache);
    return Py_BuildValue("(NNLLL)", state.records, state.positions, pos, batch_start, ready);
}

/* task_frames: the state of a walk over a tasks log's frames */
typedef struct {
    PyObject *items;
    PyObject *positions;
    long long base;
    const char *prefix;
    Py_ssize_t prefix_size;
    PyObject *known;
} task_state;

static int
keep_task(void *state, long long pos, long long end, const unsigned char *data,
          long long length)
{
    task_state *s = (task_state *)state;
    PyObject *item;
    if (length >= s->prefix_size && memcmp(data, s->prefix, (size_t)s->prefix_size) == 0) {
        item = s->known;
        Py_INCREF(item);
    } else {
        item = PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)length);
        if (item == NULL)
            return -1;
    }
    return append_at(s->items, s->positions, item, s->base + pos);
}

/* task_frames(buf, max_record, verified, limit, base, prefix, known)
       -> (items, positions, pos, batch_start, ready)

   decode_claims_frames's walk for a reader that counts a tasks log's records (`qw status`:
   supervisor.cli.queue_counts): each payload that begins with `prefix` (bytes) is `known`, not
   copied; any other is its bytes. `log_reading.task_frames_py` is its definition. Records
   are not decoded here: a TASK's prefix is all the counter looks at. */
static PyObject *
task_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || !PyBytes_CheckExact(args[0]) || !PyBytes_CheckExact(args[5])) {
        PyErr_SetString(PyExc_TypeError, "task_frames(buf: bytes, max_record, verified, "
                                         "limit, base, prefix: bytes, known)");
        return NULL;
    }
    long long numbers[4];
    for (int i = 0; i < 4; i++) {
        numbers[i] = PyLong_AsLongLong(args[1 + i]);
        if (numbers[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    task_state state = {PyList_New(0),           PyList_New(0),
                        numbers[3],              PyBytes_AS_STRING(args[5]),
                        PyBytes_GET_SIZE(args[5]), args[6]};
    long long pos, batch_start, ready;
    if (state.items == NULL || state.positions == NULL
        || frame_walk(args[0], numbers[0], numbers[1], numbers[2], keep_task, &state, &pos,
                      &batch_start, &ready) < 0) {
        Py_XDECREF(state.items);
        Py_XDECREF(state.positions);
        return NULL;
    }
    return Py_BuildValue("(NNLLL)", state.items, state.positions, pos, batch_start, ready);
}

/* without(items, positions, other) -> (items, positions)

   The two lists (of one length) without the places where `items` holds `other` (by
   identity): a span read for one task (decode_claims_frames with a task) made into that
   task's records, at C speed. `log_reading.without_py` is its definition. */
static PyObject *
without(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1])
        || PyList_GET_SIZE(args[0]) != PyList_GET_SIZE(args[1])) {
        PyErr_SetString(PyExc_TypeError, "without(items: list, positions: list of the same "
                                         "length, other)");
        return NULL;
    }
    PyObject *items = args[0], *positions = args[1], *other = args[2];
    PyObject *kept = PyList_New(0), *at = PyList_New(0);
    if (kept == NULL || at == NULL)
        goto error;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (item == other)
            continue;
        if (PyList_Append(kept, item) < 0 || PyList_Append(at, PyList_GET_ITEM(positions, i)) < 0)
            goto error;
    }
    return Py_BuildValue("(NN)", kept, at);
error:
    Py_XDECREF(kept);
    Py_XDECREF(at);
    return NULL;
}

static PyMethodDef methods[] = {
    {"decode_claims_frames", (PyCFunction)(void (*)(void))decode_claims_frames, METH_FASTCALL,
     "records.decode_claims_frames_py, in C."},
    {"without", (PyCFunction)(void (*)(void))without, METH_FASTCALL,
     "log_reading.without_py, in C."},
    {"task_frames", (PyCFunction)(void (*)(void))task_frames, METH_FASTCALL,
     "log_reading.task_frames_py, in C."},
    {"decode_claims_all", (PyCFunction)(void (*)(void))decode_claims_all, METH_FASTCALL,
     "records.decode_claims_all, in C."},
    {"decode_claims_entries", (PyCFunction)(void (*)(void))decode_claims_entries, METH_FASTCALL,
     "records.decode_claims_entries, in C."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "queue_worker.protocol._cdecode", "The claims records decoded in C.", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__cdecode(void)
{
    return PyModule_Create(&module);
}
