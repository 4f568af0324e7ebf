// .npy reading and writing: round trips of every dtype and rank, files laid out by hand exactly as
// numpy writes them (versions 1.0, 2.0, 3.0, Fortran order, header variations), and every error
// path with the words its message must contain. npy_roundtrip.py checks against numpy itself.
#include "attn/npy.hpp"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "support/testing.hpp"

namespace attn::io {
namespace {

// ---------------------------------------------------------------------------------------------
// Helpers

std::vector<std::byte> to_bytes(std::string_view s) {
  std::vector<std::byte> out(s.size());
  if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());
  return out;
}

// A .npy file of the given version around `header` and `data`, with the header length as numpy
// writes it (2 bytes little-endian for 1.0, 4 bytes for 2.0 and 3.0); no padding is added.
std::vector<std::byte> npy_file(std::string_view header, std::string_view data, int major = 1) {
  std::string file = "\x93NUMPY";
  file += static_cast<char>(major);
  file += '\0';
  const int width = major == 1 ? 2 : 4;
  for (int i = 0; i < width; ++i) file += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  file += header;
  file += data;
  return to_bytes(file);
}

// The little-endian bytes of some values, as the data section of a file.
template <class T>
std::string data_of(std::initializer_list<T> values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (values.size() != 0) std::memcpy(out.data(), std::data(values), out.size());
  return out;
}

// Passes if `action` throws attn::Error whose message contains every one of `parts`.
::testing::AssertionResult throws_with(const std::function<void()>& action, std::initializer_list<const char*> parts) {
  try {
    action();
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const char* part : parts)
      if (message.find(part) == std::string::npos)
        return ::testing::AssertionFailure() << "message \"" << message << "\" lacks \"" << part << "\"";
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no attn::Error was thrown";
}

// parse_npy of the file fails with a message naming "f.npy" and containing `parts`.
::testing::AssertionResult refused(const std::vector<std::byte>& file, std::initializer_list<const char*> parts) {
  auto result = throws_with([&] { parse_npy(file, "f.npy"); }, parts);
  if (!result) return result;
  return throws_with([&] { parse_npy(file, "f.npy"); }, {"f.npy: "});
}

// A header dict for a file whose data is given separately.
std::vector<std::byte> with_header(std::string_view dict, std::string_view data = "") {
  return npy_file(std::string(dict) + "\n", data);
}

// A fresh .npy path in the test temporary directory, unique to this process and test.
std::string npy_path(const std::string& stem) { return attn::testing::temp_path(stem + ".npy"); }

// Values 0, 1, 2, ... (alternating for bool) in a tensor of the given shape.
template <class T>
Tensor<T> counting_tensor(const std::vector<index_t>& shape) {
  Tensor<T> t(shape);
  for (index_t i = 0; i < t.numel(); ++i) {
    if constexpr (std::is_same_v<T, bool>)
      t.values()[static_cast<std::size_t>(i)] = i % 3 == 1;
    else
      t.values()[static_cast<std::size_t>(i)] = static_cast<T>(i) * static_cast<T>(std::is_floating_point_v<T> ? 0.5 : 1) - 3;
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// Round trips

template <class T>
class NpyRoundTrip : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, double, std::int32_t, std::int64_t, bool>;
TYPED_TEST_SUITE(NpyRoundTrip, ElementTypes);

// Every rank 0-4, including empty shapes, through memory and through a file.
TYPED_TEST(NpyRoundTrip, EveryRankThroughMemoryAndFile) {
  using T = TypeParam;
  const std::vector<std::vector<index_t>> shapes = {{}, {5}, {0}, {2, 3}, {3, 0}, {2, 3, 4}, {2, 1, 3, 2}, {1, 2, 0, 3}};
  for (const auto& shape : shapes) {
    SCOPED_TRACE(detail::dims_string(shape));
    const Tensor<T> original = counting_tensor<T>(shape);

    const NpyArray array = to_npy(original);
    EXPECT_EQ(array.dtype, dtype_of<T>());
    EXPECT_EQ(array.numel(), original.numel());
    const NpyArray parsed = parse_npy(serialize_npy(array.dtype, array.shape, array.bytes.data()), "mem");
    EXPECT_EQ(parsed.shape, shape);
    EXPECT_EQ(parsed.bytes, array.bytes);

    const std::string path = npy_path("roundtrip");
    write_npy(path, original);
    const Tensor<T> back = read_npy(path).template to_tensor<T>(path);
    std::filesystem::remove(path);
    EXPECT_EQ(back.shape(), original.shape());
    EXPECT_EQ(back.values(), original.values());
  }
}

TEST(Npy, SpecialFloatValuesSurviveBitForBit) {
  const Tensor<double> original({4}, {-0.0, 1e-310, std::numeric_limits<double>::infinity(),
                                      std::numeric_limits<double>::quiet_NaN()});
  const Tensor<double> back =
      parse_npy(serialize_npy(DType::float64, original.shape(), original.data()), "mem").to_tensor<double>("mem");
  EXPECT_EQ(std::memcmp(back.data(), original.data(), 4 * sizeof(double)), 0);
}

TEST(Npy, DtypeNamesAndSizes) {
  EXPECT_STREQ(dtype_name(DType::float32), "float32");
  EXPECT_STREQ(dtype_name(DType::float64), "float64");
  EXPECT_STREQ(dtype_name(DType::int32), "int32");
  EXPECT_STREQ(dtype_name(DType::int64), "int64");
  EXPECT_STREQ(dtype_name(DType::boolean), "bool");
  EXPECT_EQ(dtype_size(DType::float64), 8u);
  EXPECT_EQ(dtype_size(DType::boolean), 1u);
  EXPECT_TRUE(throws_with([] { dtype_name(static_cast<DType>(9)); }, {"DType value 9"}));
}

// ---------------------------------------------------------------------------------------------
// Exactly numpy's bytes (the expected files below were printed by numpy 1.24's np.save)

TEST(Npy, WritesExactlyWhatNumpySaveWrites) {
  const auto expect_numpy_file = [](DType dtype, std::vector<index_t> shape, std::string_view dict,
                                    std::string_view data) {
    std::string header(dict);
    header += std::string(117 - header.size(), ' ') + "\n";  // numpy: 128 - 10 header bytes, then '\n'
    std::string expected = std::string("\x93NUMPY\x01\x00\x76\x00", 10) + header + std::string(data);
    EXPECT_EQ(serialize_npy(dtype, shape, data.data()), to_bytes(expected)) << dict;
  };
  expect_numpy_file(DType::float32, {2, 3}, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                    std::string(24, '\0'));
  expect_numpy_file(DType::float64, {}, "{'descr': '<f8', 'fortran_order': False, 'shape': (), }",
                    data_of<double>({1.5}));
  expect_numpy_file(DType::boolean, {2}, "{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }",
                    std::string("\x01\x00", 2));
  expect_numpy_file(DType::int64, {0}, "{'descr': '<i8', 'fortran_order': False, 'shape': (0,), }", "");
}

// Any shape, even with 19-digit dimensions and rank 8, gets a header numpy's alignment rule accepts.
TEST(Npy, DataStartsAtAMultipleOf64) {
  for (const auto& shape : std::vector<std::vector<index_t>>{
           {}, {1}, {123456789, 0}, {1, 2, 3, 4, 5, 6, 7, 8}, {9223372036854775807, 0, 9223372036854775807}}) {
    SCOPED_TRACE(detail::dims_string(shape));
    index_t numel = 1;
    for (index_t d : shape) numel = d == 0 || numel == 0 ? 0 : numel * d;
    const std::vector<double> data(static_cast<std::size_t>(numel), 0.25);
    const auto file = serialize_npy(DType::float64, shape, data.data());
    const std::size_t data_start = file.size() - data.size() * sizeof(double);
    EXPECT_EQ(data_start % 64, 0u);
    EXPECT_EQ(static_cast<char>(file[data_start - 1]), '\n');
    EXPECT_EQ(parse_npy(file, "mem").shape, shape);
  }
}

TEST(Npy, ReadsNumpyVersion2File) {
  const std::string dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }";
  const auto file = npy_file(dict + std::string(115 - dict.size(), ' ') + "\n", data_of<std::int32_t>({0, 1, 2, 3, 4, 5}), 2);
  const Tensor<std::int32_t> t = parse_npy(file, "v2.npy").to_tensor<std::int32_t>("v2.npy");
  EXPECT_EQ(t.shape(), (std::vector<index_t>{2, 3}));
  EXPECT_EQ(std::vector<std::int32_t>(t.values().begin(), t.values().end()), (std::vector<std::int32_t>{0, 1, 2, 3, 4, 5}));
}

// numpy's version 3.0 file of np.asfortranarray(np.arange(6).reshape(2, 3)): the data is stored
// column by column and must come back in C order.
TEST(Npy, ReadsNumpyVersion3FortranFile) {
  const std::string dict = "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }";
  const auto file = npy_file(dict + std::string(115 - dict.size(), ' ') + "\n", data_of<std::int32_t>({0, 3, 1, 4, 2, 5}), 3);
  const Tensor<std::int32_t> t = parse_npy(file, "v3.npy").to_tensor<std::int32_t>("v3.npy");
  EXPECT_EQ(std::vector<std::int32_t>(t.values().begin(), t.values().end()), (std::vector<std::int32_t>{0, 1, 2, 3, 4, 5}));
}

// Fortran order at rank 4: element (i,j,k,l) is stored at i + 2j + 6k + 24l.
TEST(Npy, FortranOrderRank4IsTransposedToCOrder) {
  const std::vector<index_t> shape = {2, 3, 4, 2};
  std::vector<std::int64_t> fortran(48);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 2; ++l) fortran[i + 2 * j + 6 * k + 24 * l] = 1000 * i + 100 * j + 10 * k + l;
  std::string data(48 * 8, '\0');
  std::memcpy(data.data(), fortran.data(), data.size());
  const auto file = with_header("{'descr': '<i8', 'fortran_order': True, 'shape': (2, 3, 4, 2)}", data);
  const Tensor<std::int64_t> t = parse_npy(file, "f.npy").to_tensor<std::int64_t>("f.npy");
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 2; ++l) EXPECT_EQ(t(i, j, k, l), 1000 * i + 100 * j + 10 * k + l);
}

TEST(Npy, FortranOrderBoolAndRank1) {
  const auto bools = with_header("{'descr': '|b1', 'fortran_order': True, 'shape': (2, 2), }", std::string("\1\0\1\1", 4));
  const Tensor<bool> b = parse_npy(bools, "b.npy").to_tensor<bool>("b.npy");
  EXPECT_EQ(std::vector<bool>(b.data(), b.data() + b.numel()), (std::vector<bool>{true, true, false, true}));
  const auto vector = with_header("{'descr': '<f4', 'fortran_order': True, 'shape': (3,), }", data_of<float>({1, 2, 3}));
  const Tensor<float> t = parse_npy(vector, "v.npy").to_tensor<float>("v.npy");
  EXPECT_EQ(std::vector<float>(t.values().begin(), t.values().end()), (std::vector<float>{1, 2, 3}));
}

// The header grammar numpy's reader (ast.literal_eval) accepts, as far as attn needs it.
TEST(Npy, HeaderVariationsAreAccepted) {
  const std::string data = data_of<float>({1, 2});
  for (const char* dict : {
           "{'shape': (2,), 'fortran_order': False, 'descr': '<f4'}",
           "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2,)}",
           "  {  'descr'  :  '<f4'  ,\n\t'fortran_order':False,'shape':( 2 , ) , }  \n  ",
           "{'descr': '<f4', 'fortran_order': False, 'shape': (2L,), }",
           "{'fortran_order': False, 'descr': '<f4', 'shape': (2,)}\r\n",
       }) {
    SCOPED_TRACE(dict);
    const NpyArray a = parse_npy(npy_file(dict, data), "h.npy");
    EXPECT_EQ(a.dtype, DType::float32);
    EXPECT_EQ(a.shape, (std::vector<index_t>{2}));
  }
  EXPECT_EQ(parse_npy(with_header("{'descr': '<b1', 'fortran_order': False, 'shape': ()}", "\1"), "b").dtype,
            DType::boolean);
  EXPECT_EQ(parse_npy(with_header("{'descr': '<i4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1,)}",
                                  data_of<std::int32_t>({7})), "r8").shape.size(), 8u);
}

// ---------------------------------------------------------------------------------------------
// Malformed files: each is refused with a message naming the file and the problem

TEST(NpyErrors, MagicAndVersion) {
  EXPECT_TRUE(refused({}, {"the file is empty"}));
  EXPECT_TRUE(refused(to_bytes("PK\x03\x04 a zip"), {"not a .npy file", "PK\\x03\\x04"}));
  EXPECT_TRUE(refused(to_bytes("\x93NUM"), {"inside the magic and format version"}));
  EXPECT_TRUE(refused(to_bytes("\x93NUMPY\x01"), {"inside the magic and format version"}));
  auto file = with_header("{'descr': '<f4', 'fortran_order': False, 'shape': ()}", data_of<float>({1}));
  file[6] = std::byte{4};
  EXPECT_TRUE(refused(file, {"format version 4.0 is not supported", "1.0, 2.0 and 3.0"}));
  file[6] = std::byte{1};
  file[7] = std::byte{1};
  EXPECT_TRUE(refused(file, {"format version 1.1 is not supported"}));
  file[6] = std::byte{0};
  file[7] = std::byte{0};
  EXPECT_TRUE(refused(file, {"format version 0.0"}));
}

TEST(NpyErrors, HeaderLengthAndTruncation) {
  EXPECT_TRUE(refused(to_bytes(std::string("\x93NUMPY\x01\x00\x10", 9)), {"inside the header length"}));
  EXPECT_TRUE(refused(to_bytes(std::string("\x93NUMPY\x02\x00\x10\x00", 10)), {"inside the header length", "byte 12"}));
  EXPECT_TRUE(refused(to_bytes(std::string("\x93NUMPY\x01\x00\x10\x00{'descr'", 17)),
                      {"header length 16 runs past the end of the file", "end at byte 26", "has 17 bytes"}));
  EXPECT_TRUE(refused(to_bytes(std::string("\x93NUMPY\x02\x00\xff\xff\xff\xff{}", 14)),
                      {"header length 4294967295 runs past the end"}));
  EXPECT_TRUE(refused(npy_file("", ""), {"expected '{' at the start of the header", "found the end"}));
}

TEST(NpyErrors, DataShorterOrLongerThanTheShape) {
  EXPECT_TRUE(refused(with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3)}", std::string(40, 'x')),
                      {"shape (2,3) of float64 needs 48 data bytes but the file has only 40", "truncated"}));
  EXPECT_TRUE(refused(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", std::string(9, 'x')),
                      {"the file has 1 bytes after the 8 data bytes of shape (2,) of float32"}));
  EXPECT_TRUE(refused(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (0,)}", "z"),
                      {"1 bytes after the 0 data bytes"}));
  // A huge declared size is refused by comparing with the file length, not by trying to allocate.
  EXPECT_TRUE(refused(with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (100000, 100000, 100000)}"),
                      {"needs 8000000000000000 data bytes but the file has only 0"}));
}

TEST(NpyErrors, SizesThatOverflow64Bits) {
  EXPECT_TRUE(refused(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}"),
                      {"more elements than a 64-bit integer can count"}));
  EXPECT_TRUE(refused(with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (2305843009213693952,)}"),
                      {"shape (2305843009213693952,) of float64 needs more bytes than a 64-bit integer"}));
  EXPECT_TRUE(refused(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (9223372036854775808,)}"),
                      {"dimension 0 of the shape, 9223372036854775808, does not fit in a 64-bit integer"}));
  EXPECT_TRUE(refused(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 99999999999999999999999)}"),
                      {"dimension 1 of the shape", "does not fit"}));
  // A zero anywhere makes the product 0 even after large dimensions.
  EXPECT_EQ(parse_npy(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 9223372036854775807)}"), "z")
                .numel(), 0);
}

TEST(NpyErrors, BadShapes) {
  const auto shape_file = [](std::string_view shape) {
    return with_header(std::string("{'descr': '<f4', 'fortran_order': False, 'shape': ") + std::string(shape) + "}");
  };
  EXPECT_TRUE(refused(shape_file("(2, -3)"), {"dimension 1 of the shape is -3; dimensions must be non-negative"}));
  EXPECT_TRUE(refused(shape_file("[2, 3]"), {"shape must be a tuple such as (2, 3), not a list"}));
  EXPECT_TRUE(refused(shape_file("(3)"), {"(3) is an integer in parentheses, not a tuple", "(3,)"}));
  EXPECT_TRUE(refused(shape_file("((2, 3),)"), {"integers, not nested tuples"}));
  EXPECT_TRUE(refused(shape_file("(2.5,)"), {"expected ',' or ')' after a dimension", "found '.'"}));
  EXPECT_TRUE(refused(shape_file("(True,)"), {"expected an integer for dimension 0"}));
  EXPECT_TRUE(refused(shape_file("(2,,)"), {"expected an integer for dimension 1"}));
  EXPECT_TRUE(refused(shape_file("(1,1,1,1,1,1,1,1,1)"), {"more than 8 dimensions"}));
  EXPECT_TRUE(refused(shape_file("3"), {"expected '(' to open the shape tuple"}));
  EXPECT_TRUE(refused(shape_file("(2, 3"), {"expected ',' or ')'", "found '}'"}));
}

TEST(NpyErrors, BadDictSyntaxAndKeys) {
  EXPECT_TRUE(refused(with_header("{'descr' '<f4', 'fortran_order': False, 'shape': ()}"),
                      {"expected ':' after the key 'descr' at offset 9", "header: \"{'descr' '<f4'"}));
  EXPECT_TRUE(refused(with_header("{'descr': '<f4' 'fortran_order': False, 'shape': ()}"),
                      {"expected ',' or '}' after the value of 'descr'"}));
  EXPECT_TRUE(refused(with_header("{'descr': '<f4, 'fortran_order': False, 'shape': ()}"),
                      {"expected ',' or '}' after the value of 'descr' at offset 17", "found 'f'"}));
  EXPECT_TRUE(refused(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': ()"),
                      {"expected ',' or '}' after the value of 'shape'", "found the end"}));
  EXPECT_TRUE(refused(with_header("{descr: '<f4'}"), {"expected a quoted key or '}'"}));
  EXPECT_TRUE(refused(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': ()} x"),
                      {"only spaces and a newline after the closing '}'"}));
  EXPECT_TRUE(refused(npy_file("{'descr': '<f4", ""), {"the closing ' of a string"}));
  EXPECT_TRUE(refused(with_header("{'descr': '<f4', 'shape': ()}"),
                      {"lacks the key(s) 'fortran_order'", "exactly the keys"}));
  EXPECT_TRUE(refused(with_header("{}"), {"lacks the key(s) 'descr', 'fortran_order', 'shape'"}));
  EXPECT_TRUE(refused(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (), 'extra': 1}"),
                      {"unexpected key 'extra'"}));
  EXPECT_TRUE(refused(with_header("{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, 'shape': ()}"),
                      {"the key 'descr' twice"}));
  EXPECT_TRUE(refused(with_header("{'descr': '<f4', 'fortran_order': 0, 'shape': ()}"),
                      {"fortran_order must be True or False but is '0'"}));
  EXPECT_TRUE(refused(with_header("{'descr': '<f4', 'fortran_order': Falsey, 'shape': ()}"),
                      {"fortran_order must be True or False but is 'Falsey'"}));
  EXPECT_TRUE(refused(with_header("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': ()}"),
                      {"structured dtype"}));
  EXPECT_TRUE(refused(with_header("{'descr': 3, 'fortran_order': False, 'shape': ()}"),
                      {"expected a quoted dtype string"}));
  // Control bytes in a header are quoted as \xNN, never copied raw into the message.
  EXPECT_TRUE(refused(with_header(std::string("{\x01}", 3)), {"found '\\x01'"}));
}

TEST(NpyErrors, UnsupportedDtypes) {
  const auto descr_file = [](std::string_view descr) {
    return with_header(std::string("{'descr': '") + std::string(descr) + "', 'fortran_order': False, 'shape': ()}");
  };
  EXPECT_TRUE(refused(descr_file(">f4"), {"f.npy: dtype '>f4' is big-endian; only little-endian float16, float32, "
                                          "float64, int32, int64 and bool are supported"}));
  EXPECT_TRUE(refused(descr_file(">i8"), {"dtype '>i8' is big-endian"}));
  EXPECT_TRUE(refused(descr_file(">f2"), {"dtype '>f2' is big-endian"}));
  for (const char* descr : {"<i2", "|u1", "|i1", "<u4", "<c8", "|O", "<U3", "=f4", "<f16", ""}) {
    SCOPED_TRACE(descr);
    EXPECT_TRUE(refused(descr_file(descr), {"is not supported; only little-endian float16 ('<f2'), float32 ('<f4'), "
                                            "float64 ('<f8'), int32 ('<i4'), int64 ('<i8') and bool ('|b1') are supported"}));
  }
}

TEST(NpyErrors, BoolBytesOtherThanZeroOrOne) {
  EXPECT_TRUE(refused(with_header("{'descr': '|b1', 'fortran_order': False, 'shape': (3,)}", std::string("\1\0\2", 3)),
                      {"bool element 2 (in C order) has the byte value 2; only 0 (False) and 1 (True)"}));
  const std::uint8_t bad[] = {0, 255};
  const std::vector<index_t> shape = {2};
  EXPECT_TRUE(throws_with([&] { serialize_npy(DType::boolean, shape, bad); },
                          {"serialize_npy: bool element 1", "byte value 255"}));
}

// The fuzz target's rule in a deterministic form, so the plain test run checks it too: every strict
// prefix of a valid file is refused, and every single-byte change is either refused with a message
// naming the file or gives an array that keeps NpyArray's size promise.
TEST(NpyErrors, EveryTruncationAndByteChangeIsRefusedOrConsistent) {
  const std::string dict = "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }";
  const auto valid = npy_file(dict + std::string(115 - dict.size(), ' ') + "\n",
                              data_of<std::int32_t>({0, 3, 1, 4, 2, 5}), 3);
  for (std::size_t length = 0; length < valid.size(); ++length)
    EXPECT_TRUE(refused({valid.begin(), valid.begin() + static_cast<std::ptrdiff_t>(length)}, {})) << length;
  int accepted = 0;
  for (std::size_t at = 0; at < valid.size(); ++at) {
    for (unsigned value : {0u, 1u, 0x20u, 0x27u, 0x29u, 0x2cu, 0x2du, 0x39u, 0x7fu, 0xffu}) {
      auto changed = valid;
      changed[at] = static_cast<std::byte>(value);
      try {
        const NpyArray a = parse_npy(changed, "f.npy");
        EXPECT_EQ(a.bytes.size(), static_cast<std::size_t>(a.numel()) * dtype_size(a.dtype)) << at << " " << value;
        ++accepted;
      } catch (const Error& e) {
        EXPECT_TRUE(std::string_view(e.what()).starts_with("f.npy: ")) << e.what();
      }
    }
  }
  EXPECT_GT(accepted, 0);  // changes to the data or the padding are harmless
}

// ---------------------------------------------------------------------------------------------
// Converting to tensors and writing: argument errors

TEST(NpyErrors, ToTensorNeedsTheExactDtypeAndRankAtMost4) {
  const NpyArray doubles = parse_npy(with_header("{'descr': '<f8', 'fortran_order': False, 'shape': ()}",
                                                 data_of<double>({2})), "d.npy");
  EXPECT_TRUE(throws_with([&] { doubles.to_tensor<float>("d.npy"); },
                          {"d.npy: the file holds float64 but float32 is wanted", "a.astype(np.float32)"}));
  EXPECT_TRUE(throws_with([&] { doubles.to_tensor<bool>("d.npy"); }, {"bool is wanted", "np.bool_"}));
  EXPECT_TRUE(throws_with([&] { doubles.to_tensor<std::int64_t>("d.npy"); }, {"int64 is wanted"}));
  EXPECT_EQ(doubles.to_tensor<double>("d.npy")[0], 2.0);

  const NpyArray rank5 = parse_npy(with_header("{'descr': '<i4', 'fortran_order': False, 'shape': (1,1,1,1,1)}",
                                               data_of<std::int32_t>({1})), "r.npy");
  EXPECT_TRUE(throws_with([&] { rank5.to_tensor<std::int32_t>("r.npy"); },
                          {"r.npy: shape (1,1,1,1,1) has 5 dimensions; tensors have at most 4"}));

  NpyArray inconsistent{DType::int32, {3}, std::vector<std::byte>(8)};
  EXPECT_TRUE(throws_with([&] { inconsistent.to_tensor<std::int32_t>("hand"); },
                          {"hand: holds 8 bytes but shape (3,) of int32 needs 12"}));
}

TEST(NpyErrors, SerializeArguments) {
  const std::vector<index_t> negative = {2, -1}, rank9(9, 1), overflow = {1LL << 62, 4}, two = {2};
  const float values[2] = {1, 2};
  EXPECT_TRUE(throws_with([&] { serialize_npy(DType::float32, negative, values); },
                          {"serialize_npy: shape (2,-1) has the negative dimension -1 at axis 1"}));
  EXPECT_TRUE(throws_with([&] { serialize_npy(DType::float32, rank9, values); },
                          {"has 9 dimensions; attn writes at most 8"}));
  EXPECT_TRUE(throws_with([&] { serialize_npy(DType::float32, overflow, values); },
                          {"serialize_npy: shape (4611686018427387904,4)", "more elements than a 64-bit"}));
  EXPECT_TRUE(throws_with([&] { serialize_npy(DType::float32, two, nullptr); },
                          {"data is null but shape (2,) holds 2 elements"}));
  EXPECT_TRUE(throws_with([&] { serialize_npy(static_cast<DType>(7), two, values); }, {"DType value 7"}));
}

TEST(NpyErrors, FilesThatCannotBeOpenedOrRead) {
  const std::string missing = npy_path("does_not_exist");
  EXPECT_TRUE(throws_with([&] { read_npy(missing); }, {missing.c_str(), "cannot open for reading"}));
  const std::string dir = ::testing::TempDir();
  EXPECT_TRUE(throws_with([&] { read_npy(dir); }, {dir.c_str(), "reading failed"}));
  const std::string bad_dir = missing + "/sub/x.npy";
  const Tensor<float> t({1}, {1.0f});
  EXPECT_TRUE(throws_with([&] { write_npy(bad_dir, t); }, {bad_dir.c_str(), "cannot open for writing"}));

  // A file that exists but is not .npy: the message starts with its path.
  const std::string text = npy_path("text");
  std::ofstream(text) << "hello";
  EXPECT_TRUE(throws_with([&] { read_npy(text); }, {(text + ": not a .npy file").c_str()}));
  std::filesystem::remove(text);
}

// read_npy reads no more than the header declares: a stream that is not .npy is refused at its first
// bytes (found by probing: /dev/zero was read until memory ran out), data too large for the memory
// attn may use is refused before it is read, and bytes after the data are counted up to a chunk.
TEST(NpyErrors, ReadingStopsWhereTheHeaderSays) {
  if (std::filesystem::exists("/dev/zero")) {
    EXPECT_TRUE(throws_with([&] { read_npy("/dev/zero"); }, {"/dev/zero: not a .npy file", "\\x00\\x00"}));
  }
  const std::string path = npy_path("large");
  write_npy(path, Tensor<float>({512, 1024}));  // 2 MiB of data
  set_memory_limit(std::size_t{1} << 20);
  EXPECT_TRUE(throws_with([&] { read_npy(path); }, {path.c_str(), ": the data of shape (512,1024) of float32 needs"}));
  set_memory_limit(0);
  EXPECT_EQ(read_npy(path).bytes.size(), std::size_t{512 * 1024 * 4});
  std::size_t after = 0;  // bytes appended so far
  for (const std::size_t extra : {std::size_t{7}, std::size_t{65536}, std::size_t{65537}}) {
    std::ofstream(path, std::ios::binary | std::ios::app) << std::string(extra - after, 'x');
    after = extra;
    const std::string said = extra > 65536 ? "the file has more than 65536 bytes after the 2097152 data bytes"
                                           : "the file has " + std::to_string(extra) + " bytes after the 2097152 data bytes";
    EXPECT_TRUE(throws_with([&] { read_npy(path); }, {said.c_str()})) << extra;
  }
  std::filesystem::remove(path);
}

// float16 ('<f2'): written as numpy writes it, read back bit for bit; read as float it is refused.
TEST(Npy, Float16RoundTripsAndIsNotReadAsFloat) {
  Tensor<float16> t({2, 3});
  const float values[] = {-1.5f, 0.0f, 65504.0f, 6e-8f, -0.0f, 1.0f / 3};
  for (index_t i = 0; i < 6; ++i) t[i] = to_float16(values[i]);
  const NpyArray array = to_npy(t);
  EXPECT_EQ(array.dtype, DType::float16);
  const std::vector<std::byte> file = serialize_npy(array.dtype, array.shape, array.bytes.data());
  const std::string header(reinterpret_cast<const char*>(file.data()) + 10, 40);
  EXPECT_NE(header.find("'descr': '<f2'"), std::string::npos) << header;
  const NpyArray back = parse_npy(file, "h.npy");
  const Tensor<float16> read = back.to_tensor<float16>("h.npy");
  for (index_t i = 0; i < 6; ++i) EXPECT_EQ(read[i].bits, t[i].bits) << i;
  EXPECT_TRUE(throws_with([&] { (void)back.to_tensor<float>("h.npy"); }, {"h.npy", "float16", "float32"}));
}

}  // namespace
}  // namespace attn::io
