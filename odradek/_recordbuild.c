/* The bundled client's record work in C: the consumer's Records of a native batch
 * (odradek/consumer.py) and the producer's native batch of plain values
 * (odradek/producer_encoding.py). Each has a Python twin that stays the reference and the
 * fallback; tests compare them (tests/client/test_fetch_parsing.py, test_batch_format.py).
 *
 * ---- records: the consumer's side ----
 * A native batch's records decode (msgpack) to rows (offsetDelta, timestampDelta, key, value,
 * headers); the consumer hands out Record(topic, partition, offset, timestamp, key, value,
 * headers) tuples. In Python the cheapest way found costs ~140 ns a record, most of it the
 * call of tuple.__new__ through map (an argument tuple and its parsing per record); here one
 * allocation a record. Only the common shape is served: consecutive offsets (base + index) and
 * one timestamp for the whole batch; anything else returns None and the consumer takes its
 * Python path, which stays the reference (tests/client/test_fetch_parsing.py compares them).
 *
 * records(cls, topic, partition, base, stamp, rows, same_time, start) -> list | None
 *   cls        the Record type (a tuple subclass of 7 fields)
 *   base       the batch's base offset; record i gets offset base + i
 *   stamp      the int every Record shares as its timestamp
 *   rows       a tuple of rows, each a tuple of 5 (anything else: ValueError)
 *   same_time  true: a row whose timestampDelta is not the int 0 means None (not this shape)
 *   start      the index of the first row to return (rows before the fetch position)
 *
 * ---- batch, pack, seal: the producer's side ----
 * A closed batch of plain values (bytes, no headers, the batch's timestamp; a bytes key each or
 * none) is the msgpack array of rows [i, 0, key or nil, value, []] under the native 61-byte
 * header (core/kafka_batch.py's HEADER: base offset 0, leader epoch -1, no producer id, epoch
 * or sequence; docs/FORMAT.md) whose CRC is zlib's CRC-32 of bytes [CRC_START, end). Python
 * assembles it from cached strings with a join, a bytearray and a copy (pack_rows, encode_rows);
 * here two passes over the list (sizes and type checks, then the bytes) fill one bytes object
 * of the exact size. The CRC is zlib's own crc32 (the function Python's zlib module exports,
 * looked up once): one call a batch, and no zlib headers needed to build this file.
 *
 * batch(rows, keys, base_ts, max_ts, magic) -> bytes    the uncompressed batch, whole
 * pack(rows, keys) -> bytes                             its msgpack array alone (to compress)
 * seal(payload, attributes, count, base_ts, max_ts, magic) -> bytes
 *                                                       a payload (compressed) under the header
 *   rows   a list (or tuple) of bytes; keys None or a list (or tuple) of bytes as long as rows
 * A value that is not bytes is a TypeError; keys of another length, no rows, a value over
 * msgpack's 4 GiB or a batch over 2 GiB a ValueError: nothing is written then.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static PyObject *
build_records(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "records() takes 8 arguments");
        return NULL;
    }
    PyObject *cls = args[0], *topic = args[1], *partition = args[2], *stamp = args[4], *rows = args[5];
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "records(): cls must be a tuple subclass");
        return NULL;
    }
    if (!PyTuple_CheckExact(rows)) {
        PyErr_SetString(PyExc_ValueError, "the batch's records are not an array");
        return NULL;
    }
    long long base = PyLong_AsLongLong(args[3]);
    if (base == -1 && PyErr_Occurred())
        return NULL;
    int same_time = PyObject_IsTrue(args[6]);
    if (same_time < 0)
        return NULL;
    Py_ssize_t start = PyLong_AsSsize_t(args[7]);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(rows);
    if (start < 0)
        start = 0;
    if (start > n)
        start = n;
    PyTypeObject *type = (PyTypeObject *)cls;
    PyObject *out = PyList_New(n - start);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = start; i < n; i++) {
        PyObject *row = PyTuple_GET_ITEM(rows, i);
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 5) {
            PyErr_Format(PyExc_ValueError, "record %zd is not a row of 5 fields", i);
            goto error;
        }
        if (same_time) {
            PyObject *td = PyTuple_GET_ITEM(row, 1);
            if (!PyLong_CheckExact(td) || PyLong_AsLong(td) != 0) {
                PyErr_Clear();
                Py_DECREF(out);
                Py_RETURN_NONE; /* a record with a time of its own: the Python path */
            }
        }
        PyObject *offset = PyLong_FromLongLong(base + (long long)i);
        if (offset == NULL)
            goto error;
        PyObject *rec = type->tp_alloc(type, 7);
        if (rec == NULL) {
            Py_DECREF(offset);
            goto error;
        }
        Py_INCREF(topic);
        PyTuple_SET_ITEM(rec, 0, topic);
        Py_INCREF(partition);
        PyTuple_SET_ITEM(rec, 1, partition);
        PyTuple_SET_ITEM(rec, 2, offset);
        Py_INCREF(stamp);
        PyTuple_SET_ITEM(rec, 3, stamp);
        for (int f = 2; f < 5; f++) { /* key, value, headers */
            PyObject *v = PyTuple_GET_ITEM(row, f);
            Py_INCREF(v);
            PyTuple_SET_ITEM(rec, f + 2, v);
        }
        PyList_SET_ITEM(out, i - start, rec);
    }
    return out;
error:
    Py_DECREF(out);
    return NULL;
}

/* ---- the producer's batch -------------------------------------------------------------------- */

#define HEADER_SIZE 61  /* core/kafka_batch.py: HEADER, ">qiibIhiqqqhii" */
#define LOG_OVERHEAD 12 /* base offset + batch length: what the batch length does not count */
#define OFFSET_CRC 17
#define CRC_START 21    /* the CRC covers the attributes to the end */
#define BIN32_MAX 0xFFFFFFFFu

static PyObject *zlib_crc32; /* zlib.crc32, looked up when the module loads */

typedef struct {
    PyObject *const *values;
    PyObject *const *keys; /* NULL: keyless */
    Py_ssize_t n;
    size_t size;           /* bytes of the msgpack array of rows */
} Rows;

static inline size_t
uint_size(size_t i) /* msgpack's smallest unsigned int: fixint, uint8, uint16, uint32 */
{
    return i < 128 ? 1 : i < 256 ? 2 : i < 65536 ? 3 : 5;
}

static inline size_t
head_size(size_t n) /* a bin header: bin8, bin16, bin32 */
{
    return n < 256 ? 2 : n < 65536 ? 3 : 5;
}

static inline char *
put16(char *p, uint32_t v)
{
    p[0] = (char)(v >> 8);
    p[1] = (char)v;
    return p + 2;
}

static inline char *
put32(char *p, uint32_t v)
{
    p[0] = (char)(v >> 24);
    p[1] = (char)(v >> 16);
    p[2] = (char)(v >> 8);
    p[3] = (char)v;
    return p + 4;
}

static inline char *
put64(char *p, uint64_t v)
{
    p = put32(p, (uint32_t)(v >> 32));
    return put32(p, (uint32_t)v);
}

static inline char *
put_uint(char *p, size_t i)
{
    if (i < 128) {
        *p++ = (char)i;
    } else if (i < 256) {
        *p++ = (char)0xcc;
        *p++ = (char)i;
    } else if (i < 65536) {
        *p++ = (char)0xcd;
        p = put16(p, (uint32_t)i);
    } else {
        *p++ = (char)0xce;
        p = put32(p, (uint32_t)i);
    }
    return p;
}

static inline char *
put_bin(char *p, PyObject *b)
{
    size_t n = (size_t)PyBytes_GET_SIZE(b);
    if (n < 256) {
        *p++ = (char)0xc4;
        *p++ = (char)n;
    } else if (n < 65536) {
        *p++ = (char)0xc5;
        p = put16(p, (uint32_t)n);
    } else {
        *p++ = (char)0xc6;
        p = put32(p, (uint32_t)n);
    }
    memcpy(p, PyBytes_AS_STRING(b), n);
    return p + n;
}

/* Reads rows and keys into r and sizes their msgpack array; -1 with an exception set when they
 * are not plain values. Runs no Python code, so the lists cannot change before rows_fill. */
static int
rows_read(PyObject *rows, PyObject *keys, Rows *r)
{
    if (!PyList_Check(rows) && !PyTuple_Check(rows)) {
        PyErr_Format(PyExc_TypeError, "rows must be a list of bytes, not %.100s", Py_TYPE(rows)->tp_name);
        return -1;
    }
    r->n = PySequence_Fast_GET_SIZE(rows);
    r->values = PySequence_Fast_ITEMS(rows);
    r->keys = NULL;
    if (r->n == 0) {
        PyErr_SetString(PyExc_ValueError, "a batch holds at least one record");
        return -1;
    }
    if (keys != Py_None) {
        if (!PyList_Check(keys) && !PyTuple_Check(keys)) {
            PyErr_Format(PyExc_TypeError, "keys must be None or a list of bytes, not %.100s",
                         Py_TYPE(keys)->tp_name);
            return -1;
        }
        if (PySequence_Fast_GET_SIZE(keys) != r->n) {
            PyErr_Format(PyExc_ValueError, "%zd keys for %zd values", PySequence_Fast_GET_SIZE(keys), r->n);
            return -1;
        }
        r->keys = PySequence_Fast_ITEMS(keys);
    }
    /* each row: fixarray(5), its position, timestamp delta 0, the key (nil: 1 byte), the value, [] */
    size_t size = r->n < 16 ? 1 : r->n < 65536 ? 3 : 5; /* fixarray, array16, array32 */
    for (Py_ssize_t i = 0; i < r->n; i++) {
        PyObject *v = r->values[i];
        if (!PyBytes_Check(v)) {
            PyErr_Format(PyExc_TypeError, "value %zd is %.100s, not bytes", i, Py_TYPE(v)->tp_name);
            return -1;
        }
        size_t vn = (size_t)PyBytes_GET_SIZE(v);
        size_t k = 1;
        if (r->keys != NULL) {
            PyObject *key = r->keys[i];
            if (!PyBytes_Check(key)) {
                PyErr_Format(PyExc_TypeError, "key %zd is %.100s, not bytes", i, Py_TYPE(key)->tp_name);
                return -1;
            }
            size_t kn = (size_t)PyBytes_GET_SIZE(key);
            if (kn > BIN32_MAX) {
                PyErr_Format(PyExc_ValueError, "key %zd is over msgpack's 4 GiB", i);
                return -1;
            }
            k = head_size(kn) + kn;
        }
        if (vn > BIN32_MAX) {
            PyErr_Format(PyExc_ValueError, "value %zd is over msgpack's 4 GiB", i);
            return -1;
        }
        size += 3 + uint_size((size_t)i) + k + head_size(vn) + vn;
        if (size > (size_t)INT32_MAX) { /* a batch's length is an int32; this also bounds the sum */
            PyErr_SetString(PyExc_ValueError, "the batch is over 2 GiB");
            return -1;
        }
    }
    r->size = size;
    return 0;
}

static void
rows_fill(const Rows *r, char *p)
{
    Py_ssize_t n = r->n;
    if (n < 16) {
        *p++ = (char)(0x90 | n);
    } else if (n < 65536) {
        *p++ = (char)0xdc;
        p = put16(p, (uint32_t)n);
    } else {
        *p++ = (char)0xdd;
        p = put32(p, (uint32_t)n);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        *p++ = (char)0x95;
        p = put_uint(p, (size_t)i);
        *p++ = 0x00; /* timestamp delta */
        if (r->keys == NULL)
            *p++ = (char)0xc0;
        else
            p = put_bin(p, r->keys[i]);
        p = put_bin(p, r->values[i]);
        *p++ = (char)0x90; /* no headers */
    }
}

/* A new bytes object of HEADER_SIZE + payload bytes, its header written but for the CRC. */
static PyObject *
new_batch(size_t payload, int attributes, long long count, long long base_ts, long long max_ts, int magic)
{
    if (payload > (size_t)INT32_MAX - HEADER_SIZE) {
        PyErr_SetString(PyExc_ValueError, "the batch is over 2 GiB");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(HEADER_SIZE + payload));
    if (out == NULL)
        return NULL;
    char *p = PyBytes_AS_STRING(out);
    p = put64(p, 0);                                                     /* base offset */
    p = put32(p, (uint32_t)(HEADER_SIZE + payload - LOG_OVERHEAD));      /* batch length */
    p = put32(p, (uint32_t)-1);                                          /* leader epoch */
    *p++ = (char)magic;
    p = put32(p, 0);                                                     /* CRC, below */
    p = put16(p, (uint32_t)attributes);
    p = put32(p, (uint32_t)(count - 1));                                 /* last offset delta */
    p = put64(p, (uint64_t)base_ts);
    p = put64(p, (uint64_t)max_ts);
    p = put64(p, (uint64_t)-1);                                          /* producer id */
    p = put16(p, 0xffff);                                                /* producer epoch */
    p = put32(p, (uint32_t)-1);                                          /* base sequence */
    put32(p, (uint32_t)count);
    return out;
}

/* Writes the CRC of a filled batch; steals out (NULL on failure). */
static PyObject *
with_crc(PyObject *out)
{
    char *p = PyBytes_AS_STRING(out);
    PyObject *view = PyMemoryView_FromMemory(p + CRC_START, PyBytes_GET_SIZE(out) - CRC_START, PyBUF_READ);
    if (view == NULL)
        goto error;
    PyObject *crc = PyObject_CallOneArg(zlib_crc32, view);
    Py_DECREF(view);
    if (crc == NULL)
        goto error;
    unsigned long value = PyLong_AsUnsignedLong(crc);
    Py_DECREF(crc);
    if (value == (unsigned long)-1 && PyErr_Occurred())
        goto error;
    put32(p + OFFSET_CRC, (uint32_t)value);
    return out;
error:
    Py_DECREF(out);
    return NULL;
}

/* The header fields all three take: time stamps as int64, magic and attributes in range. */
static int
read_header_args(PyObject *base, PyObject *top, PyObject *magic_arg, long long *base_ts, long long *max_ts,
                 int *magic)
{
    *base_ts = PyLong_AsLongLong(base);
    if (*base_ts == -1 && PyErr_Occurred())
        return -1;
    *max_ts = PyLong_AsLongLong(top);
    if (*max_ts == -1 && PyErr_Occurred())
        return -1;
    long m = PyLong_AsLong(magic_arg);
    if (m == -1 && PyErr_Occurred())
        return -1;
    if (m < -128 || m > 127) {
        PyErr_SetString(PyExc_ValueError, "magic must be a signed byte");
        return -1;
    }
    *magic = (int)m;
    return 0;
}

static PyObject *
pack_batch(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "batch() takes 5 arguments: rows, keys, base_ts, max_ts, magic");
        return NULL;
    }
    long long base_ts, max_ts;
    int magic;
    Rows r;
    if (read_header_args(args[2], args[3], args[4], &base_ts, &max_ts, &magic) < 0 || rows_read(args[0], args[1], &r) < 0)
        return NULL;
    PyObject *out = new_batch(r.size, 0, r.n, base_ts, max_ts, magic);
    if (out == NULL)
        return NULL;
    rows_fill(&r, PyBytes_AS_STRING(out) + HEADER_SIZE);
    return with_crc(out);
}

static PyObject *
pack_payload(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "pack() takes 2 arguments: rows, keys");
        return NULL;
    }
    Rows r;
    if (rows_read(args[0], args[1], &r) < 0)
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)r.size);
    if (out != NULL)
        rows_fill(&r, PyBytes_AS_STRING(out));
    return out;
}

static PyObject *
seal_payload(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "seal() takes 6 arguments: payload, attributes, count, base_ts, max_ts, magic");
        return NULL;
    }
    long long base_ts, max_ts;
    int magic;
    if (read_header_args(args[3], args[4], args[5], &base_ts, &max_ts, &magic) < 0)
        return NULL;
    long attributes = PyLong_AsLong(args[1]);
    if (attributes == -1 && PyErr_Occurred())
        return NULL;
    long long count = PyLong_AsLongLong(args[2]);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    if (attributes < -32768 || attributes > 32767 || count < INT32_MIN || count > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "attributes must be an int16 and count an int32");
        return NULL;
    }
    Py_buffer payload;
    if (PyObject_GetBuffer(args[0], &payload, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *out = new_batch((size_t)payload.len, (int)attributes, count, base_ts, max_ts, magic);
    if (out != NULL)
        memcpy(PyBytes_AS_STRING(out) + HEADER_SIZE, payload.buf, (size_t)payload.len);
    PyBuffer_Release(&payload);
    return out == NULL ? NULL : with_crc(out);
}

static PyMethodDef methods[] = {
    {"records", (PyCFunction)(void (*)(void))build_records, METH_FASTCALL,
     "records(cls, topic, partition, base, stamp, rows, same_time, start): a native batch's Records, "
     "or None when its shape is not the common one (see the source's comment)"},
    {"batch", (PyCFunction)(void (*)(void))pack_batch, METH_FASTCALL,
     "batch(rows, keys, base_ts, max_ts, magic): the native batch of plain values (bytes) and their keys "
     "(None or bytes each), uncompressed, CRC included"},
    {"pack", (PyCFunction)(void (*)(void))pack_payload, METH_FASTCALL,
     "pack(rows, keys): the msgpack array of those rows alone (producer_encoding.pack_rows' twin)"},
    {"seal", (PyCFunction)(void (*)(void))seal_payload, METH_FASTCALL,
     "seal(payload, attributes, count, base_ts, max_ts, magic): a payload under the native header, CRC included"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_recordbuild",
    .m_doc = "The bundled client's record work in C: the consumer's Records of a native batch "
             "(odradek/consumer.py), the producer's batch of plain values (odradek/producer_encoding.py)",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__recordbuild(void)
{
    if (zlib_crc32 == NULL) {
        PyObject *zlib = PyImport_ImportModule("zlib");
        if (zlib == NULL)
            return NULL;
        zlib_crc32 = PyObject_GetAttrString(zlib, "crc32");
        Py_DECREF(zlib);
        if (zlib_crc32 == NULL)
            return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "VERSION", 2) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
