#!/usr/bin/env bash
# bench/gpu-pack.sh - packs tandem's binaries from a CUDA build (build/ by default)
# with the shared libraries they need that a GPU machine may lack (Criterion and
# its dependencies; not glibc, libstdc++, the CUDA libraries or NCCL (218 MB: the GPU
# machine's own, from its CUDA or PyTorch's nvidia-nccl package, goes on LD_LIBRARY_PATH)), for
# bench/gpu.sh --bin TAR.xz on another machine.
# usage: bench/gpu-pack.sh [BUILD_DIR] OUT.tar.xz
set -euo pipefail
build=build
[ $# -eq 2 ] && { build=$1; shift; }
[ $# -eq 1 ] || { echo "usage: bench/gpu-pack.sh [BUILD_DIR] OUT.tar.xz" >&2; exit 2; }
out=$1
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib"
for b in tandem bench/bench_spec bench/bench_batch bench/bench_forward bench/bench_eagle3 bench/bench_cuda bench/bench_kv tests/test_cuda_kernels tests/test_cuda_fused tests/test_backend_cuda tests/test_cuda_arch tests/test_cuda_moe tests/test_cuda_eagle3; do
  [ -x "$build/$b" ] || { echo "error: $build/$b not built" >&2; exit 1; }
  strip -o "$stage/$(basename "$b")" "$build/$b"
  ldd "$build/$b" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libresolv.so*|libstdc++.so*|libgcc_s.so*|libcu*|libnccl*) ;;
      *) cp -Ln "$lib" "$stage/lib/" ;;
    esac
  done
done
# one big dictionary: the binaries share the same ~19 MB of CUDA code, stored once
tar -c -C "$stage" . | xz -T1 --lzma2=preset=6,dict=256MiB >"$out"
echo "$out: $(du -h "$out" | cut -f1)"
