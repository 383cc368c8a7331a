// Fuzzes the indexed-dataset reader and the GPT sample index built over it: the input is
// u32 idx_bytes, then PREFIX.idx's bytes, then PREFIX.bin's. A dataset that opens must serve
// every document and every sample without reading outside its files.
#include <cstring>
#include <vector>

#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "tests/fuzz/fuzz_util.h"

using namespace tripod;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t idx_bytes = 0;
  std::memcpy(&idx_bytes, data, 4);
  const std::string_view rest(reinterpret_cast<const char*>(data) + 4, size - 4);
  if (idx_bytes > rest.size()) return 0;
  const std::string prefix = (fuzz::scratch() / "ds").string();
  fuzz::write_file("ds.idx", rest.substr(0, idx_bytes));
  fuzz::write_file("ds.bin", rest.substr(idx_bytes));
  for (const auto& e : std::filesystem::directory_iterator(fuzz::scratch()))  // caches of earlier inputs
    if (e.path().extension() == ".gptidx") std::filesystem::remove(e.path());
  fuzz::expect_only_input_errors([&] {
    auto d = std::make_shared<const IndexedDataset>(prefix);
    int64_t tokens = 0;
    std::vector<int32_t> buf;
    for (int64_t doc = 0; doc < d->num_documents(); ++doc) {
      buf.resize(static_cast<size_t>(d->document_tokens(doc)));
      d->read_document(doc, 0, buf);
      tokens += static_cast<int64_t>(buf.size());
    }
    if (tokens == 0 || d->num_documents() == 0) return;
    GptIndexOptions o{.seq_len = 3, .seed = 7, .num_samples = 8, .doc_begin = 0, .doc_end = d->num_documents()};
    GptDataset g(d, o, nullptr);
    std::vector<int32_t> sample(4);
    for (int64_t i = 0; i < g.num_samples(); ++i) g.get(i, sample);
  });
  return 0;
}
