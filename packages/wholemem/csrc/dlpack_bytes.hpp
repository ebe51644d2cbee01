// dlpack_bytes.hpp - raw memory handed to torch as a 1-D uint8 tensor on a chosen device.
//
// Why DLPack and not __cuda_array_interface__: torch infers the device of a CUDA array
// interface from the pointer (cudaPointerGetAttributes), which names the GPU the memory
// physically lives on. A peer's chunk mapped over CUDA IPC, or the node leader's DEVICE
// allocation, lives on another GPU than the one this rank computes on; torch would then
// place the tensor on the other GPU (running every kernel there) or copy it. A DLPack
// tensor carries its device explicitly, so the tensor is on this rank's GPU and reads the
// peer's memory over NVLink / PCIe (peer access), with no copy.
//
// The structures follow the DLPack ABI (dlpack.h, "DLManagedTensor", capsule name
// "dltensor"); only the parts this file uses are declared.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

#include "distkit/error.hpp"

namespace wholemem {
namespace dlpack {

struct DLDevice {
  int32_t device_type;  // 1 = kDLCPU, 2 = kDLCUDA
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // 1 = kDLUInt
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

constexpr int32_t kDLCPU = 1;
constexpr int32_t kDLCUDA = 2;

/// What the tensor owns: its shape and a reference to the Python object keeping the
/// memory alive.
struct Holder {
  DLManagedTensor managed{};
  int64_t shape[1] = {0};
  int64_t strides[1] = {1};
  PyObject* owner = nullptr;
};

inline void release(DLManagedTensor* self) {
  auto* h = static_cast<Holder*>(self->manager_ctx);
  // torch may free the tensor on any thread, with or without the GIL; at interpreter
  // shutdown the reference is dropped with the process instead
  if (h->owner != nullptr && Py_IsInitialized()
#if PY_VERSION_HEX >= 0x030D0000
      && !Py_IsFinalizing()
#else
      && !_Py_IsFinalizing()
#endif
  ) {
    PyGILState_STATE st = PyGILState_Ensure();
    Py_DECREF(h->owner);
    PyGILState_Release(st);
  }
  delete h;
}

/// A "dltensor" capsule over [ptr, ptr + nbytes) as uint8 on (device_type, device_id);
/// `owner` is kept alive until torch frees the tensor.
inline pybind11::capsule bytes_capsule(uintptr_t ptr, int64_t nbytes, int device_type, int device_id,
                                       const pybind11::object& owner) {
  distkit::check(nbytes >= 0, "negative size ", nbytes);
  distkit::check(device_type == kDLCPU || device_type == kDLCUDA, "unsupported DLPack device type ", device_type);
  auto* h = new Holder();
  h->shape[0] = nbytes;
  h->owner = owner.ptr();
  Py_INCREF(h->owner);
  DLTensor& t = h->managed.dl_tensor;
  t.data = reinterpret_cast<void*>(ptr);
  t.device = DLDevice{device_type, device_type == kDLCPU ? 0 : device_id};
  t.ndim = 1;
  t.dtype = DLDataType{1, 8, 1};
  t.shape = h->shape;
  t.strides = h->strides;
  t.byte_offset = 0;
  h->managed.manager_ctx = h;
  h->managed.deleter = &release;
  // A capsule never consumed (renamed "used_dltensor" by the consumer) frees itself.
  PyObject* cap = PyCapsule_New(&h->managed, "dltensor", [](PyObject* c) {
    if (PyCapsule_IsValid(c, "dltensor")) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, "dltensor"));
      if (m != nullptr) m->deleter(m);
    }
  });
  if (cap == nullptr) {
    release(&h->managed);
    throw pybind11::error_already_set();
  }
  return pybind11::reinterpret_steal<pybind11::capsule>(cap);
}

}  // namespace dlpack
}  // namespace wholemem
