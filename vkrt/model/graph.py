"""Graph: the plain ops (nodes.py) of one recording in order, each tagged with the part of the
forward pass it belongs to, as the model code emits them; fuse.py then rewrites them."""

from __future__ import annotations

from ..memory import Tensor
from .nodes import Call, MatMul, Node, Norm, Residual


class Graph:
    """The ops of a recording of T tokens over the activations `s` (Scratch). `x` and `cur` are
    the residual stream and the normed block input, one tensor object each for every op (the
    fusion pass matches ops by the tensors they share). `pending` is the last block's output,
    which joins the residual stream at the next norm."""

    def __init__(self, s, T: int):
        self.s, self.T = s, T
        self.x, self.cur = s.cols("x", T), s.cols("cur", T)
        self.nodes: list[Node] = []
        self.part = 0
        self.segment = 0   # bumped where the engine cuts the recording into another command sequence
        self.pending: Tensor | None = None

    def add(self, node: Node) -> Node:
        node.part, node.segment = self.part, self.segment
        self.nodes.append(node)
        return node

    def call(self, name: str, fn) -> None:
        self.add(Call(name, fn))

    def matmul(self, w: Tensor, x: Tensor, y: Tensor, kernel_columns: int | None = None) -> None:
        self.add(MatMul(w, x, y, kernel_columns, self.s.work))

    def norm(self, src: Tensor, dst: Tensor, weight: Tensor, eps: float) -> None:
        self.add(Norm(src, dst, weight, eps))

    def join(self, o: Tensor) -> None:
        """o is the block's output: it joins the residual stream at the next norm."""
        self.pending = o

    def add_pending(self, first: int = 0) -> None:
        """x += the pending block output (columns first..T-1)."""
        if self.pending is not None:
            self.add(Residual(self.x, self.pending, first))
            self.pending = None

    def residual_norm(self, weight: Tensor, eps: float, first: int = 0) -> Tensor:
        """x += the pending block output, cur = rms_norm(x) * weight (columns first..T-1); cur."""
        self.add_pending(first)
        self.add(Norm(self.x, self.cur, weight, eps, first))
        return self.cur
