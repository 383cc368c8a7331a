// Where a tensor's bytes live.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/enum_names.h"

namespace tripod {

enum class Device : uint8_t { CPU, CUDA };
template <> struct EnumNames<Device> { static constexpr std::array<std::string_view, 2> names{"cpu", "cuda"}; };

constexpr std::string_view device_name(Device d) { return enum_name(d); }

}  // namespace tripod
