// A stream the application made on the fake HIP runtime, with its graph capture: for tests (Catch2).
#pragma once

#include <hip/hip_runtime_api.h>

#include <catch2/catch.hpp>

#include <refpool/types.hpp>

#include "app.hpp"

namespace fake_hip {

struct app_stream {
  hipStream_t handle = nullptr;
  app_stream() {
    REQUIRE(symbol<decltype(::hipStreamCreateWithFlags)>("hipStreamCreateWithFlags")(&handle, hipStreamNonBlocking) ==
            hipSuccess);
  }
  ~app_stream() { (void)symbol<decltype(::hipStreamDestroy)>("hipStreamDestroy")(handle); }
  app_stream(const app_stream&) = delete;
  app_stream& operator=(const app_stream&) = delete;
  refpool::stream_ref ref() const { return {handle}; }
  void begin_capture(hipStreamCaptureMode mode = hipStreamCaptureModeRelaxed) const {
    REQUIRE(symbol<decltype(::hipStreamBeginCapture)>("hipStreamBeginCapture")(handle, mode) == hipSuccess);
  }
  hipError_t end_capture() const {
    hipGraph_t graph = nullptr;
    return symbol<decltype(::hipStreamEndCapture)>("hipStreamEndCapture")(handle, &graph);
  }
};

}  // namespace fake_hip
