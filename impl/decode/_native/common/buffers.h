// impl.decode's compiled decoders: the output buffers decode() returns, from a small pool of
// blocks whose pages stay resident (included by module.h; called with the GIL held).
//
// Why: a 262,144-token decode returns two 1 MiB arrays. As bytearrays, each call asked malloc
// for fresh blocks; glibc serves a block that size from the top of its heap (or by mmap) and,
// once both are freed, trims the heap's top, so the next call's copy page-faulted its pages in
// afresh (482 of their 512 measured): ~1 ms of a ~13 ms decode on the machines we measure, more
// than the copy itself. Here a block freed by its last Python reference goes back to a pool of
// at most kPoolBlocks blocks and kPoolBytes bytes, and the next decode copies its output into
// a block already in memory.
//
// An OutputBuffer is a plain writable buffer (np.frombuffer wraps it without a copy, as it did
// the bytearrays). A block is reused only after its OutputBuffer is gone: every view of it
// (a numpy array, a memoryview) holds a reference, so live arrays never share a block. Small
// outputs (below kPooledFrom bytes) are not pooled: malloc keeps those in memory anyway. The
// blocks come from PyMem_RawMalloc, so tracemalloc sees them from allocation to free, pooled
// ones included: what the pool keeps shows as kept.
#pragma once

#include <Python.h>

#include <cstdint>
#include <cstring>

namespace {

constexpr size_t kPoolBlocks = 16;            // blocks kept for reuse, at most
constexpr size_t kPoolBytes = size_t{64} << 20;  // and their bytes, at most
constexpr size_t kPooledFrom = size_t{64} << 10;  // smaller outputs are not pooled

struct Block {
  uint8_t* data = nullptr;
  size_t capacity = 0;
};

// The pool (touched only with the GIL held: from to_python and from a buffer's dealloc).
struct Pool {
  Block blocks[kPoolBlocks];
  size_t count = 0, bytes = 0;
  size_t reused = 0;  // blocks handed out again (pool_stats(), for tests)
};
Pool pool;

Block new_block(size_t size) {
  size_t capacity = size < kPooledFrom ? size : (size + (size >> 3) + 4095) & ~size_t{4095};
  return Block{static_cast<uint8_t*>(PyMem_RawMalloc(capacity)), capacity};
}

void free_block(Block block) { PyMem_RawFree(block.data); }

// A block of at least `size` bytes: the smallest pooled one that fits (an output of 1 MiB in a
// block of 40 MiB would keep the large one from the next large output), else a new one.
Block take_block(size_t size) {
  if (size >= kPooledFrom) {
    size_t best = pool.count;
    for (size_t i = 0; i < pool.count; i++) {
      if (pool.blocks[i].capacity >= size &&
          (best == pool.count || pool.blocks[i].capacity < pool.blocks[best].capacity)) {
        best = i;
      }
    }
    if (best != pool.count && pool.blocks[best].capacity <= 4 * size) {
      Block block = pool.blocks[best];
      pool.blocks[best] = pool.blocks[--pool.count];
      pool.bytes -= block.capacity;
      pool.reused++;
      return block;
    }
  }
  return new_block(size);
}

// Back to the pool, or to malloc when the pool is full (or the block small).
void give_block(Block block) {
  if (block.capacity >= kPooledFrom && pool.count < kPoolBlocks &&
      pool.bytes + block.capacity <= kPoolBytes) {
    pool.blocks[pool.count++] = block;
    pool.bytes += block.capacity;
    return;
  }
  free_block(block);
}

struct OutputBuffer {
  PyObject_HEAD
  Block block;
  Py_ssize_t size;
};

int buffer_get(PyObject* self, Py_buffer* view, int flags) {
  auto* out = reinterpret_cast<OutputBuffer*>(self);
  return PyBuffer_FillInfo(view, self, out->block.data, out->size, 0, flags);
}

void buffer_dealloc(PyObject* self) {
  auto* out = reinterpret_cast<OutputBuffer*>(self);
  if (out->block.data != nullptr) give_block(out->block);
  Py_TYPE(self)->tp_free(self);
}

Py_ssize_t buffer_len(PyObject* self) { return reinterpret_cast<OutputBuffer*>(self)->size; }

PyBufferProcs buffer_procs = {buffer_get, nullptr};
PySequenceMethods buffer_sequence = {buffer_len};

PyTypeObject OutputBufferType = [] {
  PyTypeObject type{PyVarObject_HEAD_INIT(nullptr, 0)};
  type.tp_name = "impl.decode.OutputBuffer";
  type.tp_basicsize = sizeof(OutputBuffer);
  type.tp_dealloc = buffer_dealloc;
  type.tp_as_buffer = &buffer_procs;
  type.tp_as_sequence = &buffer_sequence;
  type.tp_flags = Py_TPFLAGS_DEFAULT;
  type.tp_doc = "A decoded array's bytes (a writable buffer; numpy wraps it without a copy).";
  return type;
}();

// An OutputBuffer holding a copy of the `size` bytes at `data`; nullptr (a Python error set)
// when memory runs out.
PyObject* output_buffer(const void* data, size_t size) {
  Block block = take_block(size);
  if (block.data == nullptr) return PyErr_NoMemory();
  auto* out = PyObject_New(OutputBuffer, &OutputBufferType);
  if (out == nullptr) {
    give_block(block);
    return nullptr;
  }
  if (size) std::memcpy(block.data, data, size);
  out->block = block;
  out->size = static_cast<Py_ssize_t>(size);
  return reinterpret_cast<PyObject*>(out);
}

// pool_stats() -> (blocks, bytes, reused): what the pool keeps now and how many blocks it has
// handed out again (for tests).
PyObject* py_pool_stats(PyObject*, PyObject*) {
  return Py_BuildValue("(nnn)", static_cast<Py_ssize_t>(pool.count),
                       static_cast<Py_ssize_t>(pool.bytes), static_cast<Py_ssize_t>(pool.reused));
}

}  // namespace
