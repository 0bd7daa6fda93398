/* The records of a Kafka (magic 2) batch, checked field by field as Kafka's DefaultRecord
 * reader does: the produce path's check on every topic (core/kafka_batch.py, check_records).
 *
 * Layer 1 (pure, no I/O). kafka_batch.walk is the reference, in Python; this is the same check
 * at about a hundredth of its cost, and tests/log/test_batch_validation.py keeps the two in
 * agreement on a corpus of sound and malformed batches. Byte-level rules: docs/FORMAT.md.
 *
 * A Scanner is fed the records' bytes in pieces of any size (the whole buffer of an
 * uncompressed batch, or each window log/inflate.chunks yields from a compressed one), so memory
 * stays at one window whatever the batch claims; close() says whether the records ended where
 * recordCount says. It is a byte-driven state machine over each record's fields:
 *
 *   length varint | attributes byte | timestampDelta varlong | offsetDelta varint |
 *   key length varint, key | value length varint, value | header count varint |
 *   per header: key length varint (not negative), key, value length varint, value
 *
 * Checks (each failure raises ValueError naming the record; the caller makes it INVALID_RECORD):
 * a varint no longer than its type (5 bytes, a varlong 10) and within its width (32 or 64 bits);
 * a record length not negative; offset deltas 0, 1, 2, ... in order (a producer's numbering);
 * a header count not negative and not beyond the record's length; header keys not negative;
 * each record exactly as long as its length says; exactly `count` records and no byte after.
 * A negative key, value or header value length is a null (Kafka's reading). With `keyless` a
 * list, the index of each record without a key is appended to it (KIP-467, compacted topics).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define SCAN_VERSION 1 /* kafka_batch checks it: a stale build is not used */

enum phase {
    P_LEN, P_ATTR, P_TS, P_OFF, P_KLEN, P_VLEN, P_HCOUNT, P_HKLEN, P_HVLEN, P_SKIP, P_DONE
};

static const char *const FIELD[] = {
    "length", "attributes", "timestampDelta", "offsetDelta", "key length", "value length",
    "header count", "header key length", "header value length", "", ""
};

typedef struct {
    PyObject_HEAD
    int64_t count;       /* records the batch says it holds */
    int64_t index;       /* the record being read */
    int64_t total;       /* bytes fed so far */
    int64_t rec_start;   /* where the current record's body starts (after its length) */
    int64_t rec_len;     /* its length */
    int64_t skip;        /* bytes of a key or value still to pass (P_SKIP) */
    int64_t headers;     /* headers still to read */
    uint64_t acc;        /* a varint read so far */
    int nbytes;          /* its bytes read so far */
    int phase;
    int after_skip;      /* the phase once `skip` is done */
    int failed;
    PyObject *keyless;   /* list or NULL */
} Scanner;

static PyObject *
fail(Scanner *s, const char *fmt, ...)
{
    va_list va;
    va_start(va, fmt);
    s->failed = 1;
    PyErr_FormatV(PyExc_ValueError, fmt, va);
    va_end(va);
    return NULL;
}

static int
scanner_init(Scanner *s, PyObject *args, PyObject *kw)
{
    static char *names[] = {"count", "keyless", NULL};
    long long count;
    PyObject *keyless = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "L|O", names, &count, &keyless))
        return -1;
    if (keyless != Py_None && !PyList_Check(keyless)) {
        PyErr_SetString(PyExc_TypeError, "keyless must be a list or None");
        return -1;
    }
    s->count = count;
    s->index = s->total = s->rec_start = s->rec_len = s->skip = s->headers = 0;
    s->acc = 0;
    s->nbytes = s->failed = 0;
    s->phase = count > 0 ? P_LEN : P_DONE;
    s->after_skip = P_LEN;
    Py_XINCREF(keyless == Py_None ? NULL : keyless);
    Py_XSETREF(s->keyless, keyless == Py_None ? NULL : keyless);
    return 0;
}

static void
scanner_dealloc(Scanner *s)
{
    Py_XDECREF(s->keyless);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* Pass `n` bytes of a key or value (n <= 0: null or empty), then go to `next`. */
#define SKIP_THEN(n, next) do { \
        if ((n) > 0) { s->skip = (n); s->after_skip = (next); s->phase = P_SKIP; } \
        else s->phase = (next); \
    } while (0)

/* The current record's fields are all read: check its size, go to the next one. */
static int
end_record(Scanner *s, int64_t at)
{
    if (at - s->rec_start != s->rec_len) {
        fail(s, "record %lld: invalid record size: expected to read %lld bytes in record payload, "
             "but instead read %lld", (long long)s->index, (long long)s->rec_len,
             (long long)(at - s->rec_start));
        return -1;
    }
    s->index++;
    s->phase = s->index < s->count ? P_LEN : P_DONE;
    return 0;
}

static PyObject *
scanner_feed(Scanner *s, PyObject *arg)
{
    Py_buffer view;
    if (s->failed)
        return fail(s, "the scanner already failed");
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *start = view.buf, *p = start, *end = start + view.len;
    PyObject *result = Py_None;
    while (p < end) {
        int phase = s->phase;
        if (phase == P_SKIP) {
            int64_t left = end - p;
            if (s->skip > left) {
                s->skip -= left;
                p = end;
                break;
            }
            p += s->skip;
            s->skip = 0;
            s->phase = s->after_skip;
            if (s->phase == P_LEN && end_record(s, s->total + (p - start)) < 0)
                goto error;
            continue;
        }
        if (phase == P_DONE) {
            fail(s, "bytes remain after the batch's %lld records (Kafka: incorrect declared batch size, "
                 "records still remaining)", (long long)s->count);
            goto error;
        }
        unsigned int b = *p++;
        if (phase == P_ATTR) {  /* one byte, unused in magic 2 */
            s->phase = P_TS;
            continue;
        }
        int wide = phase == P_TS;  /* the one varlong */
        int n = s->nbytes;
        s->acc |= (uint64_t)(b & 0x7F) << (7 * n);
        n++;
        if (b & 0x80) {
            if (n == (wide ? 10 : 5)) {
                fail(s, "record %lld: %s varint longer than %d bytes", (long long)s->index, FIELD[phase],
                     wide ? 10 : 5);
                goto error;
            }
            s->nbytes = n;
            continue;
        }
        if (wide ? (n == 10 && b > 1) : (s->acc >> 32) != 0) {
            fail(s, "record %lld: %s varint overflows %d bits", (long long)s->index, FIELD[phase],
                 wide ? 64 : 32);
            goto error;
        }
        int64_t v = (int64_t)(s->acc >> 1) ^ -(int64_t)(s->acc & 1);
        s->acc = 0;
        s->nbytes = 0;
        switch (phase) {
        case P_LEN:
            if (v < 0) {
                fail(s, "record %lld has a negative length %lld", (long long)s->index, (long long)v);
                goto error;
            }
            s->rec_len = v;
            s->rec_start = s->total + (p - start);
            s->phase = P_ATTR;
            break;
        case P_TS:
            s->phase = P_OFF;
            break;
        case P_OFF:
            if (v != s->index) {
                fail(s, "record %lld has offset delta %lld (a producer numbers its records 0 to "
                     "recordCount - 1)", (long long)s->index, (long long)v);
                goto error;
            }
            s->phase = P_KLEN;
            break;
        case P_KLEN:
            if (v < 0 && s->keyless) {
                PyObject *i = PyLong_FromLongLong(s->index);
                if (i == NULL || PyList_Append(s->keyless, i) < 0) {
                    Py_XDECREF(i);
                    s->failed = 1;
                    goto error;
                }
                Py_DECREF(i);
            }
            SKIP_THEN(v, P_VLEN);
            break;
        case P_VLEN:
            SKIP_THEN(v, P_HCOUNT);
            break;
        case P_HCOUNT:
            if (v < 0 || v > s->rec_len) {
                fail(s, "record %lld has an invalid header count %lld", (long long)s->index, (long long)v);
                goto error;
            }
            s->headers = v;
            if (v == 0 && end_record(s, s->total + (p - start)) < 0)
                goto error;
            if (v > 0)
                s->phase = P_HKLEN;
            break;
        case P_HKLEN:
            if (v < 0) {
                fail(s, "record %lld has a header key of negative size %lld", (long long)s->index,
                     (long long)v);
                goto error;
            }
            SKIP_THEN(v, P_HVLEN);
            break;
        case P_HVLEN:
            s->headers--;
            SKIP_THEN(v, s->headers > 0 ? P_HKLEN : P_LEN);
            if (s->phase == P_LEN && end_record(s, s->total + (p - start)) < 0)
                goto error;
            break;
        }
    }
    s->total += view.len;
    Py_INCREF(result);
    PyBuffer_Release(&view);
    return result;
error:
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *
scanner_close(Scanner *s, PyObject *Py_UNUSED(ignored))
{
    if (s->failed)
        return fail(s, "the scanner already failed");
    if (s->phase != P_DONE)
        return fail(s, "recordCount says %lld records; the records end in record %lld (Kafka: incorrect "
                    "declared batch size, premature EOF)", (long long)s->count, (long long)s->index);
    Py_RETURN_NONE;
}

static PyMethodDef scanner_methods[] = {
    {"feed", (PyCFunction)scanner_feed, METH_O,
     "feed(bytes-like): check the next piece of the records; ValueError at the first fault"},
    {"close", (PyCFunction)scanner_close, METH_NOARGS,
     "close(): ValueError unless exactly `count` records were read"},
    {NULL, NULL, 0, NULL}
};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "odradek.core._recordscan.Scanner",
    .tp_doc = "Scanner(count, keyless=None): the records of a magic-2 batch, fed in pieces",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)scanner_init,
    .tp_dealloc = (destructor)scanner_dealloc,
    .tp_methods = scanner_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_recordscan",
    .m_doc = "Kafka's DefaultRecord checks over a magic-2 batch's records, in C (core/kafka_batch.py)",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__recordscan(void)
{
    if (PyType_Ready(&ScannerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&ScannerType);
    if (PyModule_AddObject(m, "Scanner", (PyObject *)&ScannerType) < 0
        || PyModule_AddIntConstant(m, "VERSION", SCAN_VERSION) < 0) {
        Py_DECREF(&ScannerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
