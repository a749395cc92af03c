"""Handoff: the residual stream crossing from one stage of a layer split to the next (one hop
per device boundary per micro-batch).

Where both devices import host memory, one anonymous host allocation is imported into both: the
sender's last command copies x there and the receiver's first command copies it into its own
activations, with nothing copied by the CPU (the host only waits for the sender between the
two submissions). Otherwise the sender copies into a readback buffer, the host copies that into
a host-visible buffer of the receiver (`carry`). Two copies (`parity`) let a stage write the
next micro-batch's activations while the next stage still reads the last one's."""

from __future__ import annotations

import logging

from ..errors import HostImportError, VulkanError
from ..memory import Buffer, BufferRange, MemoryKind
from ..memory.anonymous import AnonymousMemory
from ..memory.imported import ImportedBuffer
from ..owned import Owned
from ..units import fmt_bytes

log = logging.getLogger("vkrt")

COPIES = 2


class Handoff(Owned):
    """`nbytes` of activations, COPIES times, from device `sender` to device `receiver`."""

    def __init__(self, sender, receiver, nbytes: int):
        super().__init__(f"handoff {sender.label} -> {receiver.label}")
        self.nbytes = nbytes
        self._memory = self._out = self._in = None
        self.shared = False
        try:
            self._import(sender, receiver)
        except (HostImportError, VulkanError) as exc:
            log.info("%s: importing one host allocation into both devices failed (%s); the host copies "
                     "the activations across", self.label, exc)
            self._free()
        try:
            if not self.shared:
                size = COPIES * nbytes
                self._out = Buffer(sender, size, MemoryKind.READBACK, label=f"{self.label} (sent)")
                self._in = Buffer(receiver, size, MemoryKind.HOST, label=f"{self.label} (received)")
        except BaseException:
            self.close()
            raise
        log.debug("%s: %s x %d, %s", self.label, fmt_bytes(nbytes), COPIES,
                  "one host allocation imported into both" if self.shared else "copied by the host")

    def _import(self, sender, receiver) -> None:
        if not (sender.settings.register_host and sender.profile.host_import and receiver.profile.host_import):
            raise HostImportError("a device cannot import host memory (or VKRT_REGISTER_HOST=0)")
        align = max(sender.profile.host_import_alignment, receiver.profile.host_import_alignment, 4096)
        size = -(-COPIES * self.nbytes // align) * align
        self._memory = AnonymousMemory(size, label=self.label)
        self._out = ImportedBuffer(sender, self._memory.address, size, label=f"{self.label} (sender's import)")
        self._in = ImportedBuffer(receiver, self._memory.address, size, label=f"{self.label} (receiver's import)")
        self.shared = True

    def send(self, parity: int, nbytes: int) -> BufferRange:
        """Where the sender writes a micro-batch's activations (nbytes of them)."""
        return self._out.range(parity * self.nbytes, nbytes)

    def receive(self, parity: int, nbytes: int) -> BufferRange:
        """Where the receiver reads them."""
        return self._in.range(parity * self.nbytes, nbytes)

    def carry(self, parity: int, nbytes: int) -> None:
        """After the sender finished and before the receiver starts: bring the bytes across
        (nothing to do where both devices see the same memory)."""
        if not self.shared:
            self._in.write(self._out.read(nbytes=nbytes, offset=parity * self.nbytes), parity * self.nbytes)

    def _free(self) -> None:
        for obj in (self._in, self._out, self._memory):   # the imports before the memory they map
            if obj is not None:
                obj.close()
        self._in = self._out = self._memory = None
        self.shared = False

    def _release(self) -> None:
        self._free()
