/* The bundled consumer's Records of a native batch, built in C (odradek/consumer.py).
 *
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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

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

static PyMethodDef methods[] = {
    {"records", (PyCFunction)(void (*)(void))build_records, METH_FASTCALL,
     "records(cls, topic, partition, base, stamp, rows, same_time, start): a native batch's Records, "
     "or None when its shape is not the common one (see the source's comment)"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_recordbuild",
    .m_doc = "The bundled consumer's Records of a native batch, built in C (odradek/consumer.py)",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__recordbuild(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "VERSION", 1) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
