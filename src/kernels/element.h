// kernels/element.h — scalar read/write of one element of any dtype as a
// double. For tests, tools and checks; never for hot loops.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/half.h"
#include "shoal/types.h"

namespace shoal::kernels {

inline void put_element(DataType dt, void* p, size_t i, double v) {
  switch (dt) {
    case DataType::kFloat16: static_cast<uint16_t*>(p)[i] = float_to_half(static_cast<float>(v)); break;
    case DataType::kBFloat16: static_cast<uint16_t*>(p)[i] = float_to_bfloat16(static_cast<float>(v)); break;
    case DataType::kFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DataType::kFloat64: static_cast<double*>(p)[i] = v; break;
    case DataType::kInt8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(static_cast<int64_t>(v)); break;
    case DataType::kUInt8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(static_cast<int64_t>(v)); break;
    case DataType::kInt32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(static_cast<int64_t>(v)); break;
    case DataType::kInt64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case DataType::kBool: static_cast<uint8_t*>(p)[i] = v != 0; break;
  }
}

inline double get_element(DataType dt, const void* p, size_t i) {
  switch (dt) {
    case DataType::kFloat16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case DataType::kBFloat16: return bfloat16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DataType::kFloat32: return static_cast<const float*>(p)[i];
    case DataType::kFloat64: return static_cast<const double*>(p)[i];
    case DataType::kInt8: return static_cast<const int8_t*>(p)[i];
    case DataType::kUInt8: return static_cast<const uint8_t*>(p)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(p)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DataType::kBool: return static_cast<const uint8_t*>(p)[i];
  }
  return 0;
}

}  // namespace shoal::kernels
