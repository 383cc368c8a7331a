// Output paths (core/output_path.h): what cannot be written is an InputError naming the option,
// the path and why; what can is accepted, and nothing is created by the check.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "cli_util.h"
#include "core/error.h"
#include "core/output_path.h"

namespace tripod {
namespace {

namespace fs = std::filesystem;

// The InputError message of `check`, or "" when it passes.
template <class Fn> std::string refusal(Fn&& check) {
  try {
    check();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(OutputPath, FileNeedsAnExistingWritableFolder) {
  const fs::path d = test::scratch_dir("output_file");
  test::write_file(d / "file", "x");
  EXPECT_EQ(refusal([&] { check_output_file((d / "new.safetensors").string(), "--out"); }), "");
  EXPECT_EQ(refusal([&] { check_output_file((d / "file").string(), "--out"); }), "");  // replaced: the caller's rule
  std::string e = refusal([&] { check_output_file((d / "no" / "a.safetensors").string(), "--out"); });
  EXPECT_NE(e.find("--out " + (d / "no" / "a.safetensors").string()), std::string::npos) << e;
  EXPECT_NE(e.find("folder " + (d / "no").string() + " does not exist"), std::string::npos) << e;
  e = refusal([&] { check_output_file(d.string(), ""); });
  EXPECT_EQ(e.rfind(d.string() + ": is a folder", 0), 0u) << e;
  e = refusal([&] { check_output_file((d / "file" / "x.toml").string(), "--out"); });
  EXPECT_NE(e.find((d / "file").string() + " is a file, not a folder"), std::string::npos) << e;
  EXPECT_NE(refusal([&] { check_output_file("", "--out"); }).find("--out"), std::string::npos);
  // A relative path's folder is the working directory's.
  EXPECT_EQ(refusal([&] { check_output_file("relative.bin", "--output-prefix"); }), "");
  EXPECT_FALSE(fs::exists(d / "new.safetensors"));
  EXPECT_FALSE(fs::exists(d / "no"));
  fs::remove_all(d);
}

TEST(OutputPath, FolderNeedsAWritableAncestor) {
  const fs::path d = test::scratch_dir("output_dir");
  test::write_file(d / "file", "x");
  EXPECT_EQ(refusal([&] { check_output_dir((d / "a" / "b" / "c").string(), ""); }), "");  // parents are created
  EXPECT_EQ(refusal([&] { check_output_dir(d.string(), ""); }), "");
  std::string e = refusal([&] { check_output_dir((d / "file").string(), ""); });
  EXPECT_EQ(e, (d / "file").string() + ": is a file; a folder is written there") << e;
  e = refusal([&] { check_output_dir((d / "file" / "sub" / "x").string(), ""); });
  EXPECT_NE(e.find((d / "file").string() + " is a file, not a folder"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(d / "a"));
  if (::geteuid() != 0) {  // root may write anywhere
    fs::create_directories(d / "ro");
    fs::permissions(d / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    e = refusal([&] { check_output_dir((d / "ro" / "x").string(), ""); });
    EXPECT_NE(e.find("is not writable"), std::string::npos) << e;
    e = refusal([&] { check_output_file((d / "ro" / "x").string(), "--out"); });
    EXPECT_NE(e.find("is not writable"), std::string::npos) << e;
    fs::permissions(d / "ro", fs::perms::owner_all);
  }
  fs::remove_all(d);
}

}  // namespace
}  // namespace tripod
