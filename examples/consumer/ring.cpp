// A consumer of the installed attn::distributed: causal ring attention over the ranks of
// MPI_COMM_WORLD (run it with mpiexec -n P), each rank's rows checked against attn's single-process
// result on the whole sequence, which every rank computes for itself.
#include <mpi.h>

#include <cmath>
#include <cstdio>

#include "attn/attn.hpp"
#include "attn/distributed.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int ranks = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // The whole queries, keys and values (1, 2, 37, 8), element e = sin(e * 0.37 + seed).
  constexpr attn::index_t H = 2, L = 37, D = 8;
  const auto whole = [](double seed) {
    attn::Tensor<float> t({1, H, L, D});
    for (attn::index_t e = 0; e < t.numel(); ++e) t.data()[e] = static_cast<float>(std::sin(e * 0.37 + seed));
    return t;
  };
  const attn::Tensor<float> q = whole(0), k = whole(1), v = whole(2);
  attn::Mask<float> mask;
  mask.causal = attn::Causal::top_left;
  const attn::Tensor<float> expected = attn::scaled_dot_product_attention<float>(q.view(), k.view(), v.view(), mask);

  // This rank's rows (the zigzag layout) of each tensor.
  const auto rows = attn::shard_rows(L, ranks, rank, attn::ShardLayout::zigzag);
  const attn::index_t n_r = attn::shard_length(L, ranks, rank, attn::ShardLayout::zigzag);
  const auto shard = [&](const attn::Tensor<float>& t) {
    attn::Tensor<float> s({1, H, n_r, D});
    for (attn::index_t h = 0; h < H; ++h) {
      attn::index_t local = 0;
      for (const auto& [begin, end] : rows)
        for (attn::index_t i = begin; i < end; ++i, ++local)
          for (attn::index_t c = 0; c < D; ++c) s.data()[(h * n_r + local) * D + c] = t.data()[(h * L + i) * D + c];
    }
    return s;
  };
  const attn::Tensor<float> q_r = shard(q), k_r = shard(k), v_r = shard(v), want = shard(expected);
  attn::Tensor<float> out({1, H, n_r, D}), lse({1, H, n_r});
  attn::ring_sdpa_forward<float>(MPI_COMM_WORLD, out.view(), lse.view(), q_r.view(), k_r.view(), v_r.view(), mask, {},
                                 attn::ShardLayout::zigzag);
  double mine = 0, worst = 0;
  for (attn::index_t e = 0; e < out.numel(); ++e) mine = std::fmax(mine, std::fabs(out.data()[e] - want.data()[e]));
  MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) std::printf("ring attention on %d ranks: off the single process by %.3g\n", ranks, worst);
  MPI_Finalize();
  return worst < 1e-5 ? 0 : 1;
}
