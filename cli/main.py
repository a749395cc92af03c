"""The `vkrt` command: a thin click layer over the runtime."""

from __future__ import annotations

import logging
import sys

import click

from vkrt import __version__
from vkrt.errors import VkrtError
from vkrt.settings import Settings

from .common import check_settings


class VkrtGroup(click.Group):
    """Turns vkrt errors into one clear line on stderr and exit status 1, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except VkrtError as exc:
            raise click.ClickException(str(exc)) from None


@click.group(cls=VkrtGroup)
@click.version_option(__version__, prog_name="vkrt")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.pass_context
def cli(ctx, verbose: int) -> None:
    """Run and serve GGUF language models on Vulkan GPUs (environment variables:
    python -m vkrt.settings --markdown)."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    ctx.obj = check_settings(Settings.from_env())   # read once; commands pass it down (common.settings)


def _register() -> None:
    from .bench import bench
    from .bench_h2d import bench_h2d
    from .devices import devices
    from .perplexity import perplexity
    from .run import run
    from .serve import serve

    cli.add_command(devices)
    cli.add_command(run)
    cli.add_command(serve)
    cli.add_command(bench)
    cli.add_command(bench_h2d)
    cli.add_command(perplexity)


_register()


def main() -> None:
    cli(prog_name="vkrt")
