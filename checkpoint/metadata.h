// A checkpoint's metadata.json, checked completely before any of it is used: its checksum, and
// every field tripod reads by type and range. Also the comparison of the recorded model with the
// model a run builds.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace tripod {

// The value of metadata.json's "metadata_crc32c" for `meta`: the CRC32C of its compact dump
// without that field, as 8 hex digits.
std::string metadata_checksum(nlohmann::json meta);

// InputError naming `path` and the field when the metadata is not what tripod writes: format and
// version, the checksum (format 2 on), file list (plain names ending .h5, sizes), iteration,
// sample and batch counts, grid, model, trainer and lr_schedule fields.
void validate_metadata(const nlohmann::json& meta, const std::string& path);

// InputError naming the key and both values when a key of the recorded `model` object (the
// checkpoint's "model") that changes the function the model computes differs from `current` (the
// same record of this run's model). Keys absent from the checkpoint (written before they
// existed) are not compared; seq_len never is (learned positions are compared by max_positions).
void check_model_record(const nlohmann::json& recorded, const nlohmann::json& current, const std::string& path);

}  // namespace tripod
