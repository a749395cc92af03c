"""Host -> device bandwidth of each host memory path: the same measurement as `vkrt bench-h2d`.

    python bench/h2d.py [--max-size 1G] [--queue both|compute|transfer] [--iters N] [--json]

Pageable memory via the staging ring, imported anonymous memory, a file-backed mmap (imported
or its fallback copy), the forced host-visible fallback, and a naive allocate-copy-free upload;
on the compute and the transfer queue; CUDA pinned/pageable copies as the limit where PyTorch
with CUDA is installed. See cli/bench_h2d.py.
"""

from vkrt.cli.bench_h2d import bench_h2d

if __name__ == "__main__":
    bench_h2d(prog_name="bench/h2d.py")
