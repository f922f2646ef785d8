/* The frame-decoding loop of logstore.framing, in C (see logstore/native.py).

   decode_loop(buf, max_record, verified, limit) -> (starts, datas, pos, batch_start, ready)

   Exactly `framing._decode_loop`, which stays the definition (the tests compare the two on
   arbitrary, torn and corrupt buffers): walk the frames of `buf` (bytes) from offset 0 while
   each is whole and valid, keeping each frame's offset and a copy of its payload. A frame
   ends its batch when it is not CONTINUED, or when it ends at or before `verified`; stop
   once `limit` frames of ended batches are kept. No protocol rule lives here: frames only.

   decode_entries(buf, max_record, verified, limit, base, Entry) -> (entries, pos, batch_start, ready)

   The same walk, keeping for each frame Entry(base + offset, base + end, payload, None)
   (built as tuple.__new__ builds it) instead of the offset and the payload: exactly
   `framing._decode_entries`, its definition.

   frame_batch(records, max_record) -> (frames, lengths) | None

   The other way: a batch's frames built for an append (`FileLog.append_many`), exactly
   `logstore.file_log._frame_batch_py` (see below).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_framewalk.h"

typedef struct {
    PyObject *starts;
    PyObject *datas;
} pair_state;

static int
keep_pair(void *state, long long pos, long long end, const unsigned char *data, long long length)
{
    pair_state *s = (pair_state *)state;
    PyObject *offset = PyLong_FromLongLong(pos);
    if (offset == NULL)
        return -1;
    int failed = PyList_Append(s->starts, offset);
    Py_DECREF(offset);
    if (failed)
        return -1;
    PyObject *payload = PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)length);
    if (payload == NULL)
        return -1;
    failed = PyList_Append(s->datas, payload);
    Py_DECREF(payload);
    return failed;
}

static PyObject *
decode_loop(PyObject *self, PyObject *args)
{
    PyObject *buf;
    long long max_record, verified, limit;
    if (!PyArg_ParseTuple(args, "SLLL:decode_loop", &buf, &max_record, &verified, &limit))
        return NULL;
    pair_state state = {PyList_New(0), PyList_New(0)};
    long long pos, batch_start, ready;
    if (state.starts == NULL || state.datas == NULL ||
        frame_walk(buf, max_record, verified, limit, keep_pair, &state, &pos, &batch_start, &ready) < 0) {
        Py_XDECREF(state.starts);
        Py_XDECREF(state.datas);
        return NULL;
    }
    return Py_BuildValue("(NNLLL)", state.starts, state.datas, pos, batch_start, ready);
}

typedef struct {
    PyObject *entries;
    PyTypeObject *entry;
    long long base;
} entry_state;

static int
keep_entry(void *state, long long pos, long long end, const unsigned char *data, long long length)
{
    entry_state *s = (entry_state *)state;
    PyObject *position = PyLong_FromLongLong(s->base + pos);
    PyObject *next = PyLong_FromLongLong(s->base + end);
    PyObject *payload = PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)length);
    PyObject *entry = NULL;
    if (position != NULL && next != NULL && payload != NULL)
        entry = s->entry->tp_alloc(s->entry, 4);
    if (entry == NULL) {
        Py_XDECREF(position);
        Py_XDECREF(next);
        Py_XDECREF(payload);
        return -1;
    }
    PyTuple_SET_ITEM(entry, 0, position);
    PyTuple_SET_ITEM(entry, 1, next);
    PyTuple_SET_ITEM(entry, 2, payload);
    Py_INCREF(Py_None);
    PyTuple_SET_ITEM(entry, 3, Py_None);
    int failed = PyList_Append(s->entries, entry);
    Py_DECREF(entry);
    return failed;
}

/* METH_FASTCALL (every read calls it): the arguments as "SLLLLO!" with PyType_Type
   would take them, without building a tuple to parse. */
static PyObject *
decode_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "decode_entries(buf, max_record, verified, limit, base, Entry)");
        return NULL;
    }
    PyObject *buf = args[0], *entry = args[5];
    if (!PyBytes_Check(buf)) {
        PyErr_SetString(PyExc_TypeError, "decode_entries: buf must be bytes");
        return NULL;
    }
    long long numbers[4]; /* max_record, verified, limit, base */
    for (int i = 0; i < 4; i++) {
        numbers[i] = PyLong_AsLongLong(args[i + 1]);
        if (numbers[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    long long max_record = numbers[0], verified = numbers[1], limit = numbers[2], base = numbers[3];
    if (!PyType_Check(entry) || !PyType_IsSubtype((PyTypeObject *)entry, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "decode_entries: Entry must be a tuple type");
        return NULL;
    }
    entry_state state = {PyList_New(0), (PyTypeObject *)entry, base};
    if (state.entries == NULL)
        return NULL;
    long long pos, batch_start, ready;
    if (frame_walk(buf, max_record, verified, limit, keep_entry, &state, &pos, &batch_start, &ready) < 0) {
        Py_DECREF(state.entries);
        return NULL;
    }
    return Py_BuildValue("(NLLL)", state.entries, pos, batch_start, ready);
}

/* walk_frames(buf, base, max_record, open_batch, last_batch, check) -> (end, open_batch, last_batch)

   Exactly `framing._walk_frames`, its definition: walk the frame headers of `buf` (any
   buffer: bytes or a memoryview of a read) from offset 0 while whole, valid-looking frames
   fit, checking each payload's checksum only with `check`; a frame that is not CONTINUED
   ends its batch. Offsets answered are absolute (`base` + offset in the buffer). */
static PyObject *
walk_frames(PyObject *self, PyObject *args)
{
    Py_buffer view;
    long long base, max_record, open_batch, last_batch;
    int check;
    if (!PyArg_ParseTuple(args, "y*LLLLp:walk_frames", &view, &base, &max_record, &open_batch,
                          &last_batch, &check))
        return NULL;
    const unsigned char *buf = (const unsigned char *)view.buf;
    long long size = (long long)view.len;
    long long last = size - HEADER;
    long long pos = 0;
    while (pos <= last) {
        const unsigned char *h = buf + pos;
        uint32_t word = le32(h), check_word = le32(h + 4);
        long long length = (long long)(word & LENGTH_MASK);
        long long end = pos + HEADER + length;
        if ((word ^ check_word) != 0xFFFFFFFFu || length > max_record || end > size)
            break;
        if (check && (uint32_t)crc32((uLong)word, h + HEADER, (uInt)length) != le32(h + 8))
            break;
        pos = end;
        if (!(word & 0x80000000u)) { /* not CONTINUED: a batch ends here */
            last_batch = open_batch;
            open_batch = base + pos;
        }
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(LLL)", base + pos, open_batch, last_batch);
}

/* frame_batch(records, max_record) -> (frames, lengths) | None

   Exactly `logstore.file_log._frame_batch_py`, its definition: the frames of `records` (a
   list or tuple of bytes) as one batch, each record behind its header (its length, with
   CONTINUED on every frame but the last; that word's complement; the CRC-32 of the payload
   seeded with the word), and each frame's length (header included). None where the Python
   raises or takes another type: a record longer than `max_record`, or not bytes (the
   caller's Python then says why). METH_FASTCALL: an append's every batch calls it. */
static void
put_le32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static PyObject *
frame_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "frame_batch(records, max_record)");
        return NULL;
    }
    long long max_record = PyLong_AsLongLong(args[1]);
    if (max_record == -1 && PyErr_Occurred())
        return NULL;
    PyObject *seq = PySequence_Fast(args[0], "frame_batch: records must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_CheckExact(items[i]) || (long long)PyBytes_GET_SIZE(items[i]) > max_record ||
            PyBytes_GET_SIZE(items[i]) > (Py_ssize_t)LENGTH_MASK) {
            Py_DECREF(seq);
            Py_RETURN_NONE;
        }
        total += HEADER + PyBytes_GET_SIZE(items[i]);
    }
    PyObject *frames = PyBytes_FromStringAndSize(NULL, total);
    PyObject *lengths = PyList_New(n);
    if (frames == NULL || lengths == NULL) {
        Py_XDECREF(frames);
        Py_XDECREF(lengths);
        Py_DECREF(seq);
        return NULL;
    }
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(frames);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t length = PyBytes_GET_SIZE(items[i]);
        const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(items[i]);
        uint32_t word = (uint32_t)length | (i < n - 1 ? 0x80000000u : 0u);
        put_le32(out, word);
        put_le32(out + 4, ~word);
        put_le32(out + 8, (uint32_t)crc32((uLong)word, data, (uInt)length));
        memcpy(out + HEADER, data, (size_t)length);
        out += HEADER + length;
        PyObject *size = PyLong_FromSsize_t(HEADER + length);
        if (size == NULL) {
            Py_DECREF(frames);
            Py_DECREF(lengths);
            Py_DECREF(seq);
            return NULL;
        }
        PyList_SET_ITEM(lengths, i, size);
    }
    Py_DECREF(seq);
    return Py_BuildValue("(NN)", frames, lengths);
}

static PyMethodDef methods[] = {
    {"decode_loop", decode_loop, METH_VARARGS, "framing._decode_loop, in C."},
    {"decode_entries", (PyCFunction)(void (*)(void))decode_entries, METH_FASTCALL,
     "framing._decode_entries, in C."},
    {"walk_frames", walk_frames, METH_VARARGS, "framing._walk_frames, in C."},
    {"frame_batch", (PyCFunction)(void (*)(void))frame_batch, METH_FASTCALL,
     "file_log._frame_batch_py, in C."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "logstore._cframes", "The frame-decoding loop in C.", -1, methods,
};

PyMODINIT_FUNC
PyInit__cframes(void)
{
    return PyModule_Create(&module);
}
