"""The array interfaces a refpool.Buffer exposes, so other libraries read it without copying:
__cuda_array_interface__ (version 3) for CUDA device memory, __array_interface__ (version 3) for host
memory, and DLPack (__dlpack__, __dlpack_device__) through a ctypes DLManagedTensor, with no
framework imported. A DLPack export holds its own reference to the buffer (a retained handle) until
the consumer deletes it; consumers of the array interfaces keep the Buffer object alive instead."""
import ctypes
import threading

# DLPack's DLDeviceType values (dlpack.h, v0.8 and later).
DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_ROCM, DL_ROCM_HOST = 1, 2, 3, 10, 11
# DLDataTypeCode by the typestr's kind letter.
_DL_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}


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


@_DELETER
def _delete(managed):
    address = ctypes.cast(managed, ctypes.c_void_p).value
    with _exports_lock:
        entry = _exports.pop(address, None)
    if entry is not None:
        entry[2].close()  # the retained buffer


# The capsule's destructor gets the capsule while it is being destroyed: as a plain address, never
# as a Python object (a new reference to it there would bring it back to life).
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


@_CAPSULE_DESTRUCTOR
def _capsule_destructor(capsule):
    # A capsule still named "dltensor" was never consumed: its owner must delete the tensor. A
    # consumer renames it "used_dltensor" and calls the deleter itself.
    if _capsule_is_valid(capsule, b"dltensor"):
        _delete(ctypes.cast(_capsule_pointer(capsule, b"dltensor"), ctypes.POINTER(DLManagedTensor)))


def dl_dtype(typestr):
    """The DLDataType of an array-interface typestr; BufferError for kinds DLPack has no code for."""
    kind, size = typestr[1], int(typestr[2:])
    if kind not in _DL_CODES or (typestr[0] == ">" and size > 1):
        raise BufferError(f"refpool: DLPack has no data type for typestr {typestr!r}")
    return DLDataType(_DL_CODES[kind], 8 * size, 1)


def dlpack_capsule(retained, ptr, shape, typestr, device):
    """A "dltensor" PyCapsule over `retained` (a Buffer handle the export owns and closes in its deleter)."""
    shape_array = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    managed = DLManagedTensor()
    managed.dl_tensor = DLTensor(ptr or None, DLDevice(*device), len(shape), dl_dtype(typestr),
                                 ctypes.cast(shape_array, ctypes.POINTER(ctypes.c_int64)), None, 0)
    managed.manager_ctx = None
    managed.deleter = _delete
    address = ctypes.addressof(managed)
    with _exports_lock:
        _exports[address] = (managed, shape_array, retained)
    return _capsule_new(address, b"dltensor", _capsule_destructor)
