// .npy reading and writing; the format and the promises are described in attn/npy.hpp.
//
// Reading never trusts the file: the header is parsed from a view into the file's bytes, every
// size it declares is checked for overflow and against the bytes actually present before any
// buffer is sized from it, and the parser is a single forward pass without recursion, so neither
// a hostile length nor a deeply nested header can exhaust memory or the stack.
#include "attn/npy.hpp"

#include <sys/stat.h>

#include <array>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string_view>

namespace attn::io {

static_assert(std::endian::native == std::endian::little,
              "attn copies .npy element bytes unchanged and so needs a little-endian host");

namespace {

using attn::detail::cat;
using attn::detail::dims_string;
using attn::detail::fail;

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr std::size_t kArrayAlign = 64;  // numpy starts the data at a multiple of this
constexpr std::size_t kGrowthAxisDigits = 21;  // numpy's spare room to grow shape[0] in place

// `text` made safe to quote in a message: non-printable bytes as \xNN, cut after `max_chars`.
std::string printable(std::string_view text, std::size_t max_chars = 60) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (out.size() >= max_chars) return out + "...";
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      constexpr char kHex[] = "0123456789abcdef";
      out += {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
    }
  }
  return out;
}

// The dict fields of a .npy header, as written; checked for meaning by the caller.
struct HeaderFields {
  std::string descr;
  bool fortran_order = false;
  std::vector<index_t> shape;
};

// Parses the header dict, the subset of Python literal syntax numpy writes and reads:
//   { 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// Keys in any order, each exactly once; single or double quotes; any whitespace between tokens;
// trailing commas in the dict and the shape tuple; Python 2's 'L' suffix on integers. Every
// failure is an attn::Error naming the file, what was expected, where, and quoting the header.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& name) : text_(text), name_(name) {}

  HeaderFields parse() {
    HeaderFields fields;
    bool has_descr = false, has_fortran_order = false, has_shape = false;
    skip_space();
    expect('{', "'{' at the start of the header");
    while (true) {
      skip_space();
      if (consume('}')) break;  // an empty dict, or a trailing comma before '}'
      if (!at_quote()) syntax_error("a quoted key or '}'");
      const std::string key = parse_string();
      skip_space();
      expect(':', cat("':' after the key '", printable(key), "'"));
      skip_space();
      if (key == "descr") {
        mark_seen(has_descr, key);
        if (peek() == '[') fail_header("descr is a list, which describes a structured dtype; attn reads only plain arrays");
        if (!at_quote()) syntax_error("a quoted dtype string after 'descr':");
        fields.descr = parse_string();
      } else if (key == "fortran_order") {
        mark_seen(has_fortran_order, key);
        fields.fortran_order = parse_bool();
      } else if (key == "shape") {
        mark_seen(has_shape, key);
        fields.shape = parse_shape();
      } else {
        fail_header(cat("the header has the unexpected key '", printable(key),
                        "'; a .npy header has exactly the keys 'descr', 'fortran_order' and 'shape'"));
      }
      skip_space();
      if (consume(',')) continue;
      expect('}', cat("',' or '}' after the value of '", key, "'"));
      break;
    }
    skip_space();
    if (pos_ != text_.size()) syntax_error("only spaces and a newline after the closing '}'");
    if (!has_descr || !has_fortran_order || !has_shape) {
      std::string missing;
      const auto note_missing = [&](bool seen, const char* key) {
        if (!seen) missing += (missing.empty() ? "'" : ", '") + std::string(key) + "'";
      };
      note_missing(has_descr, "descr");
      note_missing(has_fortran_order, "fortran_order");
      note_missing(has_shape, "shape");
      fail_header(cat("the header lacks the key(s) ", missing,
                      "; a .npy header has exactly the keys 'descr', 'fortran_order' and 'shape'"));
    }
    return fields;
  }

 private:
  [[noreturn]] void fail_header(const std::string& problem) const {
    fail(name_, ": ", problem, " (header: \"", printable(text_, 120), "\")");
  }
  [[noreturn]] void syntax_error(const std::string& expected) const {
    const std::string found = pos_ < text_.size() ? cat("'", printable(text_.substr(pos_, 1)), "'") : "the end";
    fail_header(cat("the header is not a valid .npy dict: expected ", expected, " at offset ", pos_,
                    " of the header but found ", found));
  }
  void mark_seen(bool& seen, const std::string& key) const {
    if (seen) fail_header(cat("the header has the key '", key, "' twice"));
    seen = true;
  }

  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool at_quote() const { return peek() == '\'' || peek() == '"'; }
  bool at_digit() const { return peek() >= '0' && peek() <= '9'; }
  static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
  void skip_space() {
    while (pos_ < text_.size() && is_space(text_[pos_])) ++pos_;
  }
  bool consume(char c) {
    if (pos_ >= text_.size() || text_[pos_] != c) return false;
    ++pos_;
    return true;
  }
  void expect(char c, const std::string& what) {
    if (!consume(c)) syntax_error(what);
  }

  // A string literal in single or double quotes; a backslash takes the next character literally
  // (enough for numpy's descrs, none of which contains a backslash or a quote).
  std::string parse_string() {
    const char quote = text_[pos_++];
    std::string value;
    while (pos_ < text_.size() && text_[pos_] != quote && text_[pos_] != '\n') {
      if (text_[pos_] == '\\' && pos_ + 1 < text_.size()) ++pos_;
      value += text_[pos_++];
    }
    if (!consume(quote)) syntax_error(cat("the closing ", quote, " of a string"));
    return value;
  }

  // True or False, as a whole word; numpy refuses 0 and 1 here, and so does attn.
  bool parse_bool() {
    if (consume_word("True")) return true;
    if (consume_word("False")) return false;
    fail_header(cat("fortran_order must be True or False but is '", printable(token_at_pos(), 20), "'"));
  }

  // Consumes `word` if it stands at pos_ as a whole word (not the start of "Falsehood").
  bool consume_word(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    const std::size_t end = pos_ + word.size();
    const char next = end < text_.size() ? text_[end] : ' ';
    if (std::isalnum(static_cast<unsigned char>(next)) || next == '_') return false;
    pos_ = end;
    return true;
  }

  // The text from pos_ up to the next separator, to quote a bad value.
  std::string_view token_at_pos() const {
    std::size_t end = pos_;
    while (end < text_.size() && text_[end] != ',' && text_[end] != '}' && !is_space(text_[end])) ++end;
    return text_.substr(pos_, end - pos_);
  }

  // A tuple of non-negative integers: () for rank 0, (3,) for rank 1, (2, 3) and so on.
  std::vector<index_t> parse_shape() {
    if (peek() == '[') fail_header("shape must be a tuple such as (2, 3), not a list");
    expect('(', "'(' to open the shape tuple");
    std::vector<index_t> shape;
    skip_space();
    if (consume(')')) return shape;
    while (true) {
      if (static_cast<int>(shape.size()) == kMaxNpyRank)
        fail_header(cat("the shape has more than ", kMaxNpyRank, " dimensions; attn reads at most ", kMaxNpyRank));
      shape.push_back(parse_dimension(static_cast<int>(shape.size())));
      skip_space();
      if (consume(',')) {
        skip_space();
        if (consume(')')) return shape;
        continue;
      }
      if (consume(')')) {
        if (shape.size() == 1)
          fail_header(cat("the shape (", shape[0], ") is an integer in parentheses, not a tuple; a one-dimensional "
                          "shape is written (", shape[0], ",)"));
        return shape;
      }
      syntax_error("',' or ')' after a dimension of the shape");
    }
  }

  // One dimension: decimal digits, optionally signed (to report negatives clearly) and with
  // Python 2's 'L' suffix. Refuses values below 0 or above the largest index_t.
  index_t parse_dimension(int axis) {
    const std::size_t start = pos_;
    const bool negative = consume('-');
    if (!at_digit()) {
      if (peek() == '(' || peek() == '[') fail_header("the shape must hold integers, not nested tuples or lists");
      syntax_error(cat("an integer for dimension ", axis, " of the shape"));
    }
    index_t value = 0;
    bool overflow = false;
    while (at_digit()) {
      overflow |= __builtin_mul_overflow(value, index_t{10}, &value);
      overflow |= __builtin_add_overflow(value, index_t{text_[pos_] - '0'}, &value);
      ++pos_;
    }
    const std::string_view literal = text_.substr(start, pos_ - start);
    if (peek() == 'L' || peek() == 'l') ++pos_;
    if (overflow)
      fail_header(cat("dimension ", axis, " of the shape, ", printable(literal, 30),
                      ", does not fit in a 64-bit integer"));
    if (negative && value != 0)
      fail_header(cat("dimension ", axis, " of the shape is ", literal, "; dimensions must be non-negative"));
    return value;
  }

  std::string_view text_;
  const std::string& name_;
  std::size_t pos_ = 0;
};

// The DType of a header's descr, or an attn::Error that says why it is not supported.
DType dtype_from_descr(const std::string& descr, const std::string& name) {
  if (descr == "<f2") return DType::float16;
  if (descr == "<f4") return DType::float32;
  if (descr == "<f8") return DType::float64;
  if (descr == "<i4") return DType::int32;
  if (descr == "<i8") return DType::int64;
  if (descr == "|b1" || descr == "<b1") return DType::boolean;
  constexpr const char* kSupported =
      "only little-endian float16 ('<f2'), float32 ('<f4'), float64 ('<f8'), int32 ('<i4'), int64 ('<i8') and bool "
      "('|b1') are supported";
  const std::string_view type = std::string_view(descr).substr(descr.empty() ? 0 : 1);
  if (!descr.empty() && descr[0] == '>' && (type == "f2" || type == "f4" || type == "f8" || type == "i4" || type == "i8"))
    fail(name, ": dtype '", descr, "' is big-endian; only little-endian float16, float32, float64, int32, int64 and bool are "
         "supported (in numpy: a.astype(a.dtype.newbyteorder('<')))");
  fail(name, ": dtype '", printable(descr, 40), "' is not supported; ", kSupported);
}

// Reads an unsigned little-endian integer of `width` bytes.
std::uint64_t read_le(const std::byte* p, std::size_t width) {
  std::uint64_t v = 0;
  for (std::size_t i = width; i-- > 0;) v = (v << 8) | std::to_integer<std::uint64_t>(p[i]);
  return v;
}

// The number of elements of `shape`, or an attn::Error naming `name` if it overflows index_t.
index_t checked_numel(std::span<const index_t> shape, const std::string& name) {
  index_t n = 1;
  for (index_t d : shape)
    if (__builtin_mul_overflow(n, d, &n))
      fail(name, ": shape ", dims_string(shape), " has more elements than a 64-bit integer can count");
  return n;
}

// numel * itemsize, or an attn::Error naming `name` if it overflows index_t.
index_t checked_nbytes(std::span<const index_t> shape, DType dtype, const std::string& name) {
  index_t bytes = 0;
  if (__builtin_mul_overflow(checked_numel(shape, name), static_cast<index_t>(dtype_size(dtype)), &bytes))
    fail(name, ": shape ", dims_string(shape), " of ", dtype_name(dtype),
         " needs more bytes than a 64-bit integer can count");
  return bytes;
}

// The elements of `src`, stored in Fortran order (first dimension fastest), rearranged into C
// order (last dimension fastest). Walks the output in order and the input with an odometer.
std::vector<std::byte> fortran_to_c(std::span<const std::byte> src, std::span<const index_t> shape,
                                    std::size_t itemsize) {
  const int rank = static_cast<int>(shape.size());
  const auto numel = static_cast<index_t>(src.size() / itemsize);
  if (rank < 2 || numel == 0) return {src.begin(), src.end()};  // both orders agree
  std::vector<std::byte> out(src.size());
  std::array<index_t, kMaxNpyRank> f_stride{}, index{};
  f_stride[0] = 1;
  for (int k = 1; k < rank; ++k) f_stride[k] = f_stride[k - 1] * shape[k - 1];  // <= numel, no overflow
  index_t from = 0;  // the element of src at `index`
  for (index_t to = 0; to < numel; ++to) {
    std::memcpy(out.data() + to * itemsize, src.data() + from * itemsize, itemsize);
    for (int k = rank - 1; k >= 0; --k) {  // advance `index` in C order
      if (++index[k] < shape[k]) {
        from += f_stride[k];
        break;
      }
      from -= (shape[k] - 1) * f_stride[k];
      index[k] = 0;
    }
  }
  return out;
}

// attn::Error, naming `who`, unless every byte is 0 or 1 (the only bools numpy writes). Any other
// byte copied into a C++ bool is undefined behaviour, so it is refused at the boundary.
void check_bool_bytes(std::span<const std::byte> bytes, const std::string& who) {
  for (std::size_t i = 0; i < bytes.size(); ++i)
    if (std::to_integer<unsigned>(bytes[i]) > 1)
      fail(who, ": bool element ", i, " (in C order) has the byte value ", std::to_integer<unsigned>(bytes[i]),
           "; only 0 (False) and 1 (True) are valid");
}

// The descr numpy writes for each DType.
const char* descr_of(DType dtype) {
  switch (dtype) {
    case DType::float32: return "<f4";
    case DType::float64: return "<f8";
    case DType::int32: return "<i4";
    case DType::int64: return "<i8";
    case DType::boolean: return "|b1";
    case DType::float16: return "<f2";
  }
  fail("descr_of: DType value ", static_cast<int>(dtype), " is not one of the six dtypes");
}

// Python's repr of the shape tuple: (), (3,), (2, 3).
std::string shape_repr(std::span<const index_t> shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

// Magic, version 1.0, header length and header, exactly as numpy 1.24's write_array builds them.
std::string header_bytes(DType dtype, std::span<const index_t> shape) {
  std::string dict = cat("{'descr': '", descr_of(dtype), "', 'fortran_order': False, 'shape': ", shape_repr(shape),
                         ", }");
  // numpy leaves room for the first dimension to grow to 21 digits without moving the data.
  if (!shape.empty()) dict.append(kGrowthAxisDigits - std::to_string(shape[0]).size(), ' ');
  const std::size_t text_size = dict.size() + 1;  // with the final '\n'
  // numpy pads with 1 to 64 spaces (never 0) so that the data starts at a multiple of 64.
  const std::size_t pad = kArrayAlign - (kMagic.size() + 4 + text_size) % kArrayAlign;
  const std::size_t header_len = text_size + pad;  // at most a few hundred bytes: fits 2 bytes
  std::string out(kMagic);
  out += {'\x01', '\x00', static_cast<char>(header_len & 0xff), static_cast<char>(header_len >> 8)};
  out += dict;
  out.append(pad, ' ');
  out += '\n';
  return out;
}

// Closes a FILE* when the reader or writer returns or throws.
struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

}  // namespace

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::float32: return "float32";
    case DType::float64: return "float64";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
    case DType::boolean: return "bool";
    case DType::float16: return "float16";
  }
  fail("dtype_name: DType value ", static_cast<int>(dtype), " is not one of the six dtypes");
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::float32: return 4;
    case DType::float64: return 8;
    case DType::int32: return 4;
    case DType::int64: return 8;
    case DType::boolean: return 1;
    case DType::float16: return 2;
  }
  fail("dtype_size: DType value ", static_cast<int>(dtype), " is not one of the six dtypes");
}

index_t NpyArray::numel() const { return checked_numel(shape, "NpyArray::numel"); }

namespace {

// A .npy file's header: the array it declares (no data yet), its layout, and where its data starts.
struct Header {
  NpyArray array;
  bool fortran_order = false;
  std::size_t data_start = 0, data_bytes = 0;
};

// The header of `file`: the whole file (`whole`), or its first bytes as they are read. A prefix too
// short to hold the header gives nullopt and, in `need`, the bytes it must have to tell more; every
// other problem is the error a whole file gets.
std::optional<Header> read_header(std::span<const std::byte> file, const std::string& name, bool whole, std::size_t& need) {
  // Magic and version: "\x93NUMPY", major, minor.
  const std::string_view start(reinterpret_cast<const char*>(file.data()), std::min(file.size(), kMagic.size()));
  if (whole && file.empty()) fail(name, ": the file is empty; a .npy file starts with the magic \\x93NUMPY");
  if (start != kMagic.substr(0, start.size()))
    fail(name, ": not a .npy file: it starts with \"", printable(start), "\" instead of the magic \\x93NUMPY");
  need = kMagic.size() + 2;
  if (file.size() < need) {
    if (!whole) return std::nullopt;
    fail(name, ": the file ends after ", file.size(), " bytes, inside the magic and format version");
  }
  const unsigned major = std::to_integer<unsigned>(file[6]), minor = std::to_integer<unsigned>(file[7]);
  if (major < 1 || major > 3 || minor != 0)
    fail(name, ": .npy format version ", major, ".", minor, " is not supported; attn reads 1.0, 2.0 and 3.0");

  // Header length: 2 bytes in version 1.0, 4 in 2.0 and 3.0.
  const std::size_t length_width = major == 1 ? 2 : 4;
  const std::size_t header_start = kMagic.size() + 2 + length_width;
  need = header_start;
  if (file.size() < header_start) {
    if (!whole) return std::nullopt;
    fail(name, ": the file ends after ", file.size(), " bytes, inside the header length (version ", major,
         ".0 puts the header at byte ", header_start, ")");
  }
  const std::uint64_t header_len = read_le(file.data() + 8, length_width);
  need = header_start + header_len;
  if (header_len > file.size() - header_start) {
    if (!whole) return std::nullopt;
    fail(name, ": the header length ", header_len, " runs past the end of the file: the header would end at byte ",
         header_start + header_len, " but the file has ", file.size(), " bytes");
  }

  // The header dict and what it means. The parser works on a view into the file: a header of any
  // declared length costs no allocation beyond the strings it finds.
  const std::string_view text(reinterpret_cast<const char*>(file.data()) + header_start, header_len);
  HeaderFields fields = HeaderParser(text, name).parse();
  Header h;
  h.array.dtype = dtype_from_descr(fields.descr, name);
  h.array.shape = std::move(fields.shape);
  h.fortran_order = fields.fortran_order;
  h.data_start = header_start + header_len;
  h.data_bytes = static_cast<std::size_t>(checked_nbytes(h.array.shape, h.array.dtype, name));
  return h;
}

// The array of `header` from `data`, its data bytes (exactly header.data_bytes of them).
NpyArray with_data(Header header, std::span<const std::byte> data, const std::string& name) {
  NpyArray array = std::move(header.array);
  if (header.fortran_order)
    array.bytes = fortran_to_c(data, array.shape, dtype_size(array.dtype));
  else
    array.bytes.assign(data.begin(), data.end());
  if (array.dtype == DType::boolean) check_bool_bytes(array.bytes, name);
  return array;
}

std::string data_what(const NpyArray& array) { return cat("shape ", dims_string(array.shape), " of ", dtype_name(array.dtype)); }

}  // namespace

NpyArray parse_npy(std::span<const std::byte> file, const std::string& name) {
  std::size_t need = 0;
  Header header = *read_header(file, name, true, need);
  // The data: exactly the bytes the shape needs, checked before anything is allocated for them.
  const std::size_t nbytes = header.data_bytes, available = file.size() - header.data_start;
  const std::string what = data_what(header.array);
  if (nbytes > available)
    fail(name, ": ", what, " needs ", nbytes, " data bytes but the file has only ", available,
         " after the header; it is truncated");
  // numpy.load would ignore bytes after the data; for attn they mean a file that was written wrongly
  // or concatenated with another, so they are refused rather than silently dropped.
  if (nbytes < available)
    fail(name, ": the file has ", available - nbytes, " bytes after the ", nbytes, " data bytes of ", what,
         "; a .npy file ends with its data");
  return with_data(std::move(header), file.subspan(header.data_start), name);
}

NpyArray read_npy(const std::string& path) {
  FilePtr file(std::fopen(path.c_str(), "rb"));
  if (!file) fail(path, ": cannot open for reading: ", std::strerror(errno));
  // Read in chunks rather than trusting a size from seek/stat: that also works for pipes such as
  // /dev/stdin, and a directory shows up as a read error (EISDIR). Only as many bytes as the header
  // declares are read, and the header is checked as soon as its bytes are in (found by probing:
  // /dev/zero, read to its end before any check, ran the machine out of memory).
  std::vector<std::byte> content;
  std::array<std::byte, 1 << 16> chunk;
  bool ended = false;
  const auto read_until = [&](std::size_t want) {  // until content holds `want` bytes or the file ends
    while (!ended && content.size() < want) {
      const std::size_t ask = std::min(chunk.size(), want - content.size());
      const std::size_t got = std::fread(chunk.data(), 1, ask, file.get());
      content.insert(content.end(), chunk.begin(), chunk.begin() + static_cast<std::ptrdiff_t>(got));
      if (got < ask) ended = true;
    }
    if (std::ferror(file.get())) fail(path, ": reading failed: ", std::strerror(errno));
  };
  std::size_t need = 64;
  std::optional<Header> header;
  while (!header) {
    // A header longer than a chunk (numpy writes them under 100 bytes) is checked as data would be.
    const detail::MemoryReservation header_room(need > chunk.size() ? need : 0, cat(path, ": a .npy header of ", need, " bytes").c_str());
    read_until(need);
    header = read_header(content, path, ended, need);
  }
  // The data, checked against the memory attn may use before it is read, and up to a chunk past it:
  // bytes after the data are refused, as parse_npy refuses them.
  const std::size_t end = header->data_start + header->data_bytes;
  const std::string what = data_what(header->array);
  // (A regular file holds no more than its size: one declaring more is truncated, and is named so.)
  struct stat st {};
  const bool sized = ::fstat(::fileno(file.get()), &st) == 0 && S_ISREG(st.st_mode);
  const std::size_t at_most = sized ? std::min(header->data_bytes, static_cast<std::size_t>(st.st_size)) : header->data_bytes;
  const detail::MemoryReservation room(at_most, cat(path, ": the data of ", what).c_str());
  read_until(end + chunk.size() + 1);
  if (content.size() > end + chunk.size())  // more than parse_npy is shown; it names the exact count of fewer
    fail(path, ": the file has more than ", chunk.size(), " bytes after the ", header->data_bytes, " data bytes of ", what,
         "; a .npy file ends with its data");
  return parse_npy(content, path);
}

std::vector<std::byte> serialize_npy(DType dtype, std::span<const index_t> shape, const void* data) {
  const std::string who = "serialize_npy";
  (void)dtype_size(dtype);  // refuses a DType value outside the enum
  if (shape.size() > static_cast<std::size_t>(kMaxNpyRank))
    fail(who, ": shape ", dims_string(shape), " has ", shape.size(), " dimensions; attn writes at most ",
         kMaxNpyRank);
  for (std::size_t i = 0; i < shape.size(); ++i)
    if (shape[i] < 0)
      fail(who, ": shape ", dims_string(shape), " has the negative dimension ", shape[i], " at axis ", i);
  const index_t nbytes = checked_nbytes(shape, dtype, who);
  if (nbytes > 0 && data == nullptr)
    fail(who, ": data is null but shape ", dims_string(shape), " holds ", checked_numel(shape, who), " elements");
  const std::span<const std::byte> elements(static_cast<const std::byte*>(data), static_cast<std::size_t>(nbytes));
  if (dtype == DType::boolean) check_bool_bytes(elements, who);

  // The checks above are those parse_npy makes, so whatever is written here can be read back.
  const std::string header = header_bytes(dtype, shape);
  std::vector<std::byte> out(header.size() + elements.size());
  std::memcpy(out.data(), header.data(), header.size());
  if (!elements.empty()) std::memcpy(out.data() + header.size(), elements.data(), elements.size());
  return out;
}

void write_npy(const std::string& path, DType dtype, std::span<const index_t> shape, const void* data) {
  const std::vector<std::byte> bytes = serialize_npy(dtype, shape, data);
  FilePtr file(std::fopen(path.c_str(), "wb"));
  if (!file) fail(path, ": cannot open for writing: ", std::strerror(errno));
  if (std::fwrite(bytes.data(), 1, bytes.size(), file.get()) != bytes.size())
    fail(path, ": writing failed: ", std::strerror(errno));
  // fclose flushes; a full disk may only show here.
  if (std::fclose(file.release()) != 0) fail(path, ": writing failed: ", std::strerror(errno));
}

template <NpyElement T>
Tensor<T> NpyArray::to_tensor(const std::string& name) const {
  constexpr DType wanted = dtype_of<T>();
  if (dtype != wanted)
    fail(name, ": the file holds ", dtype_name(dtype), " but ", dtype_name(wanted),
         " is wanted; attn does not convert element types (in numpy: a.astype(np.",
         wanted == DType::boolean ? "bool_" : dtype_name(wanted), "))");
  if (shape.size() > static_cast<std::size_t>(kMaxRank))
    fail(name, ": shape ", dims_string(shape), " has ", shape.size(), " dimensions; tensors have at most ",
         kMaxRank);
  for (std::size_t i = 0; i < shape.size(); ++i)
    if (shape[i] < 0) fail(name, ": shape ", dims_string(shape), " has the negative dimension ", shape[i]);
  const index_t nbytes = checked_nbytes(shape, dtype, name);
  if (bytes.size() != static_cast<std::uint64_t>(nbytes))
    fail(name, ": holds ", bytes.size(), " bytes but shape ", dims_string(shape), " of ", dtype_name(dtype),
         " needs ", nbytes);
  if constexpr (std::same_as<T, bool>) {
    // Tensor<bool> keeps a std::vector<bool>, which has no data() to copy into.
    check_bool_bytes(bytes, name);
    std::vector<bool> values(bytes.size());
    for (std::size_t i = 0; i < bytes.size(); ++i) values[i] = bytes[i] != std::byte{0};
    return Tensor<bool>(shape, std::move(values));
  } else {
    Tensor<T> tensor(shape);
    if (!bytes.empty()) std::memcpy(tensor.data(), bytes.data(), bytes.size());
    return tensor;
  }
}

template <NpyElement T>
NpyArray to_npy(const Tensor<T>& tensor) {
  NpyArray array{dtype_of<T>(), tensor.shape(), {}};
  if constexpr (std::same_as<T, bool>) {
    array.bytes.reserve(tensor.values().size());
    for (bool v : tensor.values()) array.bytes.push_back(static_cast<std::byte>(v));
  } else {
    array.bytes.resize(tensor.values().size() * sizeof(T));
    if (!array.bytes.empty()) std::memcpy(array.bytes.data(), tensor.data(), array.bytes.size());
  }
  return array;
}

template <NpyElement T>
void write_npy(const std::string& path, const Tensor<T>& tensor) {
  if constexpr (std::same_as<T, bool>) {
    const NpyArray array = to_npy(tensor);
    write_npy(path, array.dtype, array.shape, array.bytes.data());
  } else {
    write_npy(path, dtype_of<T>(), tensor.shape(), tensor.data());
  }
}

// The six element types; other types are refused at compile time by NpyElement.
#define ATTN_NPY_INSTANTIATE(T)                                           \
  template Tensor<T> NpyArray::to_tensor<T>(const std::string&) const; \
  template NpyArray to_npy<T>(const Tensor<T>&);                        \
  template void write_npy<T>(const std::string&, const Tensor<T>&);
ATTN_NPY_INSTANTIATE(float)
ATTN_NPY_INSTANTIATE(double)
ATTN_NPY_INSTANTIATE(std::int32_t)
ATTN_NPY_INSTANTIATE(std::int64_t)
ATTN_NPY_INSTANTIATE(bool)
ATTN_NPY_INSTANTIATE(float16)
#undef ATTN_NPY_INSTANTIATE

}  // namespace attn::io
