/// @file
/// Loads the UCI optical digits (data/digits/digits.csv.gz): 1797 8x8 images of handwritten
/// digits, 64 pixel counts in 0..16 then the label per line, as shipped by scikit-learn.
///
/// Reads the gzip'd file directly through zlib (`dependency('zlib')`, Debian zlib1g-dev): the
/// committed file is the one that is read, at run time, from any path, with no build step.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <zlib.h>

#include "mlp.hpp"

namespace cohort::examples {

/// The digits as a `dataset` of 64 features scaled to [0, 1] and 10 classes. Throws
/// `std::runtime_error` when the file cannot be read or a line is malformed.
inline dataset load_digits(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open " + path);
  std::string text;
  char buf[1 << 16];
  for (int got; (got = gzread(f, buf, sizeof buf)) > 0;)
    text.append(buf, static_cast<std::size_t>(got));
  int err = 0;
  const char* msg = gzerror(f, &err);
  const std::string why = err != Z_OK && err != Z_STREAM_END ? msg : "";
  gzclose(f);
  if (!why.empty()) throw std::runtime_error(path + ": " + why);

  dataset d{64, 10, {}, {}};
  const char* p = text.c_str();
  for (std::size_t line = 1; *p != '\0'; ++line) {
    for (std::size_t col = 0; col <= 64; ++col) {
      char* end = nullptr;
      const double v = std::strtod(p, &end);
      const char want = col < 64 ? ',' : '\n';
      if (end == p || (*end != want && !(col == 64 && *end == '\0')))
        throw std::runtime_error(path + ":" + std::to_string(line) + ": malformed");
      if (col < 64) d.x.push_back(static_cast<float>(v / 16.0));
      else if (v < 0 || v > 9) throw std::runtime_error(path + ": label out of range");
      else d.y.push_back(static_cast<int>(v));
      p = *end == '\0' ? end : end + 1;
    }
  }
  return d;
}

}  // namespace cohort::examples
