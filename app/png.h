// A small RGB raster (Canvas) with lines, rectangles and a 5x7 bitmap font, and write_png(): an 8-bit
// RGB PNG (filter 0 on every row, deflated by zlib, CRC-32 from zlib). For `kcp check --plot`.
// Covered by tests/validation/test_cli.cpp (the --plot files are valid PNGs of the stated size).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kcp::app {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
};

class Canvas {
 public:
  Canvas(int width, int height, Rgb background = {255, 255, 255});
  int width() const { return w_; }
  int height() const { return h_; }
  void set(int x, int y, Rgb c);
  void line(int x0, int y0, int x1, int y1, Rgb c);
  void dashed_vline(int x, int y0, int y1, Rgb c, int dash = 4);
  void fill(int x0, int y0, int x1, int y1, Rgb c);  // inclusive corners
  // Text in the 5x7 font (letters shown upper case), `scale` pixels per font pixel; returns the width.
  int text(int x, int y, const std::string& s, Rgb c, int scale = 1);
  static int text_width(const std::string& s, int scale = 1) { return int(s.size()) * 6 * scale; }
  const std::vector<uint8_t>& pixels() const { return px_; }

 private:
  int w_, h_;
  std::vector<uint8_t> px_;
};

void write_png(const std::string& path, const Canvas& c);

}  // namespace kcp::app
