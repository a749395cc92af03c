"""Host -> device bandwidth of each host memory path, as `vkrt bench-h2d` measures it, with CUDA
pinned and pageable copies of the same sizes as the link's limit (bench/cuda_h2d.py: through
PyTorch with CUDA, else the NVIDIA driver's libcuda.so.1).

    python bench/h2d.py [--max-size 1G] [--queue both|compute|transfer] [--iters N] [--no-cuda] [--json]

See cli/bench_h2d.py for the paths measured.
"""

import click
from cuda_h2d import measure

from vkrt.cli.bench_h2d import h2d_options, measure_and_report


@click.command()
@h2d_options
@click.option("--no-cuda", is_flag=True, help="Skip the CUDA pinned/pageable reference.")
def main(max_size, min_size, queue, iters, tmpdir, as_json, no_cuda) -> None:
    """Host -> device bandwidth of each host memory path (GB/s) against CUDA's copies."""
    measure_and_report(max_size, min_size, queue, iters, tmpdir, as_json,
                       reference=None if no_cuda else measure, why_not="skipped (--no-cuda)")


if __name__ == "__main__":
    main(prog_name="bench/h2d.py")
