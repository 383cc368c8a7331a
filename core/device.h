// Where a tensor's bytes live.
#pragma once

#include <string_view>

namespace tripod {

enum class Device : uint8_t { CPU, CUDA };

constexpr std::string_view device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

}  // namespace tripod
