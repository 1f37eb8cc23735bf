"""The array interfaces a refpool.Buffer exposes, so other libraries read it without copying:
__cuda_array_interface__ (version 3) for CUDA device memory, __array_interface__ (version 3) for host
memory, and DLPack (__dlpack__, __dlpack_device__) through a ctypes DLManagedTensor, with no
framework imported. A DLPack export holds its own reference to the buffer (a retained handle) until
the consumer deletes it, as do the bytes object an __array_interface__ hands NumPy and a view()'s
memoryview; consumers of __cuda_array_interface__ keep the Buffer object alive instead.

Each format has limits of its own, checked before anything is exported: DLPack's shape and strides
are int64, its ndim int32 and its bits a uint8; NumPy, CuPy and Numba index the array interfaces
with a signed 64-bit intp, and NumPy holds at most NPY_MAXDIMS dims; a buffer-protocol length is a
Py_ssize_t. A zero-element buffer takes any dims ((0, 2**64-1) owns no memory), so these are
reached (issue 35 row 9: DLPack got [0, -1])."""
import ctypes
import sys
import threading

from ._library import lib
from .errors import LibraryError

# DLPack's DLDeviceType values (dlpack.h, v0.8 and later).
DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_ROCM, DL_ROCM_HOST = 1, 2, 3, 10, 11
# DLDataTypeCode by the typestr's kind letter.
_DL_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
# The item sizes DLPack's float and complex codes mean an IEEE format for (as NumPy exports them).
_DL_IEEE_SIZES = {"f": (2, 4, 8), "c": (8, 16)}
INT64_MAX = 2**63 - 1
_INT32_MAX = 2**31 - 1
_UINT8_MAX = 255


def contiguous_strides(shape, itemsize):
    """The byte strides of a C-contiguous array of `shape` (Python ints: nothing wraps)."""
    strides, stride = [], itemsize
    for dim in reversed(shape):
        strides.append(stride)
        stride *= dim
    return tuple(reversed(strides))


def check_extents(shape, itemsize, what):
    """BufferError unless every dim, and every stride a consumer derives for a C-contiguous array
    (in bytes, so in elements too), fits int64."""
    for axis, dim in enumerate(shape):
        if dim > INT64_MAX:
            raise BufferError(f"{what}: dim {axis} of shape {shape} is {dim}, beyond int64 (2**63-1), the largest "
                              "extent the format and its consumers hold")
    for axis, stride in enumerate(contiguous_strides(shape, itemsize)):
        if stride > INT64_MAX:
            raise BufferError(f"{what}: shape {shape} of {itemsize}-byte elements has a stride of {stride} bytes on "
                              f"axis {axis}, beyond int64 (2**63-1), the largest stride the format and its "
                              "consumers hold")


def check_numpy_dims(shape, what):
    """BufferError unless NumPy can hold `shape`'s dims: NPY_MAXDIMS is 32 before NumPy 2 and 64
    since. NumPy before 2.2.4 copies an __array_interface__ shape into a stack array of that size
    without checking its length (numpy#27949), so more dims would overwrite its stack."""
    numpy = sys.modules.get("numpy")
    try:
        limit = 64 if int(str(getattr(numpy, "__version__", "1")).split(".")[0]) >= 2 else 32
    except ValueError:
        limit = 32
    if len(shape) > limit:
        raise BufferError(f"{what}: the buffer has {len(shape)} dims; NumPy holds at most {limit} (NPY_MAXDIMS)")


def host_bytes(retain, ptr, nbytes, what):
    """A writable ctypes char array over `nbytes` at `ptr` that holds `retain()` (a new reference to
    the buffer) while it lives: what memoryviews and NumPy arrays of host memory keep alive."""
    if nbytes > sys.maxsize:
        raise BufferError(f"{what}: {nbytes} bytes are beyond a buffer's length (Py_ssize_t, {sys.maxsize})")
    array = (ctypes.c_char * nbytes).from_address(ptr) if nbytes else (ctypes.c_char * 0)()
    array.owner = retain().keep_past_exit()
    return array


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

# Exports not yet deleted, by the address of their DLManagedTensor: the struct, its shape array and
# the retained buffer live here until the consumer (or the unconsumed capsule) calls the deleter.
_exports = {}
_exports_lock = threading.Lock()


def _release_function(exports, lock):
    # Called by the deleter and the capsule's destructor of dlpack_glue.cpp, which are C: a consumer
    # may call them with its exception pending, which Python code run by ctypes cannot survive. It
    # holds what it uses itself, as module globals are gone when a tensor kept in builtins or sys
    # is deleted at exit.
    @ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    def release_export(address):
        with lock:
            entry = exports.pop(address, None)
        if entry is not None:
            entry[2].close()  # the retained buffer
    return release_export


_release_export = _release_function(_exports, _exports_lock)
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_release_export))  # never freed: C calls it as long as tensors live


class _PythonApi(ctypes.Structure):
    """What dlpack_glue.cpp calls (its struct python_api): the Python C API functions it needs, and
    _release_export."""
    _fields_ = [(name, ctypes.c_void_p) for name in ("is_initialized", "capsule_is_valid", "capsule_pointer",
                                                      "gil_ensure", "gil_release", "error_fetch", "error_restore",
                                                      "release_export")]


_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))
_glue_lock = threading.Lock()
_glue = []  # (the deleter, the capsule destructor's address), once set up


def _dlpack_glue():
    """dlpack_glue.cpp's deleter (as the DLManagedTensor field takes it) and capsule destructor (an
    address), set up on first use."""
    with _glue_lock:
        if not _glue:
            library = lib()
            api = ctypes.pythonapi
            names = ("Py_IsInitialized", "PyCapsule_IsValid", "PyCapsule_GetPointer", "PyGILState_Ensure",
                     "PyGILState_Release", "PyErr_Fetch", "PyErr_Restore")
            functions = [ctypes.cast(getattr(api, name), ctypes.c_void_p).value for name in names]
            release = ctypes.cast(_release_export, ctypes.c_void_p).value
            if library.fn("refpool_python_dlpack_setup")(_PythonApi(*functions, release)) != 0:
                raise LibraryError(f"refpool: {library.path} was built from another refpool than this package (its "
                                   "DLPack glue differs); rebuild both from one source")
            _glue.extend([_DELETER(library.address("refpool_python_dlpack_deleter")),
                          library.address("refpool_python_capsule_destructor")])
        return _glue


def dl_dtype(typestr):
    """The DLDataType of a canonical typestr (_dtypes.parse); BufferError for a type DLPack has no
    code for: another kind, big-endian, wider than its uint8 bits, or a long double."""
    kind = typestr[1]
    if kind not in _DL_CODES:
        raise BufferError(f"refpool: DLPack has no data type for typestr {typestr!r}")
    size = int(typestr[2:])
    if typestr[0] == ">" and size > 1:
        raise BufferError(f"refpool: DLPack has no data type for typestr {typestr!r} (it is little-endian only)")
    if 8 * size > _UINT8_MAX:
        raise BufferError(f"refpool: DLPack has no data type for typestr {typestr!r}: {8 * size} bits, beyond its "
                          f"8-bit field ({_UINT8_MAX})")
    if kind in _DL_IEEE_SIZES and size not in _DL_IEEE_SIZES[kind]:
        raise BufferError(f"refpool: DLPack has no data type for typestr {typestr!r}: its floats are IEEE binary16, "
                          "32 and 64, and a long double is another format (x87's 80 bits on x86)")
    return DLDataType(_DL_CODES[kind], 8 * size, 1)


def dlpack_capsule(retain, ptr, shape, typestr, device):
    """A "dltensor" PyCapsule over `retain()` (a new Buffer handle the export owns and closes in its
    deleter), made once everything else is checked (shape: check_extents)."""
    if len(shape) > _INT32_MAX:
        raise BufferError(f"refpool: DLPack's ndim is an int32; this buffer has {len(shape)} dims")
    dtype = dl_dtype(typestr)
    retained = retain().keep_past_exit()
    shape_array = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    managed = DLManagedTensor()
    managed.dl_tensor = DLTensor(ptr or None, DLDevice(*device), len(shape), dtype,
                                 ctypes.cast(shape_array, ctypes.POINTER(ctypes.c_int64)), None, 0)
    deleter, capsule_destructor = _dlpack_glue()
    managed.manager_ctx = None
    managed.deleter = deleter
    address = ctypes.addressof(managed)
    with _exports_lock:
        _exports[address] = (managed, shape_array, retained)
    return _capsule_new(address, b"dltensor", capsule_destructor)
