"""The slot scheduler: one thread owns the engine (loads it, runs every GPU step, closes it).

Each iteration admits queued jobs to idle slots (the slot holding the longest prefix of the
prompt wins), evaluates pending prompt tokens in whole micro-batches (about n_batch tokens per
iteration, so running generations keep flowing while a long prompt is read), then runs one
decode step for every generating slot together through Engine.decode (continuous batching).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable

from ..engine.engine import ADJUST_CAP, CANDIDATES
from ..errors import VkrtError
from .checkpoints import SlotCheckpoints
from .jobs import Failed, Job
from .metrics import Metrics
from .slots import Slot

log = logging.getLogger("vkrt.server")


class SchedulerClosed(VkrtError):
    """The server is shutting down or its model failed to load."""


class Scheduler:
    def __init__(self, load: Callable, n_parallel: int, metrics: Metrics,
                 on_ready: Callable[[object], None] = lambda backend: None,
                 on_failed: Callable[[BaseException], None] = lambda exc: None, ctx_checkpoints: int = 0):
        self._load, self._on_ready, self._on_failed = load, on_ready, on_failed
        self.n_parallel = n_parallel
        self.ctx_checkpoints = ctx_checkpoints
        self.metrics = metrics
        self.backend = None
        self.slots: list[Slot] = []
        self.checkpoints: list[SlotCheckpoints] = []
        self._queue: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._accepting = True
        self._thread = threading.Thread(target=self._main, name="vkrt-scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # -- called from the event loop ----------------------------------------------------------------
    def submit(self, job: Job) -> None:
        with self._cond:
            if not self._accepting or self._stopping:
                raise SchedulerClosed("the server is shutting down")
            self._queue.append(job)
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        with self._cond:
            job.cancelled = True
            self._cond.notify()

    @property
    def busy(self) -> bool:
        return bool(self._queue) or any(not s.idle for s in self.slots)

    def stop_accepting(self) -> None:
        with self._cond:
            self._accepting = False

    def cancel_all(self, message: str = "the server is shutting down") -> None:
        """Every queued and running job ends with a 503 at the next iteration."""
        with self._cond:
            for job in list(self._queue) + [s.job for s in self.slots if s.job is not None]:
                job.cancelled = True
                job.emit(Failed(503, message))
            self._cond.notify()

    def close(self, timeout: float | None = None) -> None:
        """Stop the thread; it closes the engine, model and device on its way out."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # -- the scheduler thread ----------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self.backend = self._load()
            log.info("warm-up run: %.1f s", self.backend.warm_up(self.n_parallel))
        except BaseException as exc:  # reported by the app: a clear message, then exit 1
            self._on_failed(exc)
            return
        try:
            engine = self.backend.engine
            self.tokenizer = self.backend.model.tokenizer
            self.n_ctx_slot = engine.n_ctx // self.n_parallel
            self.slots = [Slot(i, self.n_ctx_slot, self.metrics) for i in range(self.n_parallel)]
            limit = self.ctx_checkpoints if engine.recurrent else 0
            self.checkpoints = [SlotCheckpoints(i, limit) for i in range(self.n_parallel)]
            self._on_ready(self.backend)
            while self._iterate(engine):
                pass
        except BaseException as exc:
            log.exception("the scheduler stopped: %s", exc)
            self._on_failed(exc)
        finally:
            self._fail_remaining()
            self.backend.close()

    def _iterate(self, engine) -> bool:
        with self._cond:
            while not self._stopping and not self._queue and all(s.idle for s in self.slots):
                self._cond.wait()
            if self._stopping:
                return False
            self._drop_cancelled()
            self._admit(engine)
        self._prefill(engine)
        self._decode(engine)
        return True

    def _drop_cancelled(self) -> None:
        waiting = len(self._queue)
        self._queue = collections.deque(j for j in self._queue if not j.cancelled)
        self.metrics.requests_cancelled += waiting - len(self._queue)
        for s in self.slots:
            if s.job is not None and s.job.cancelled:
                self.metrics.requests_cancelled += 1
                s.release()

    def _admit(self, engine) -> None:
        while self._queue:
            idle = [s for s in self.slots if s.idle]
            if not idle:
                return
            job = self._queue.popleft()
            if job.cache_prompt:
                slot = max(idle, key=lambda s: (s.reusable(job.prompt), -s.last_used))
            else:
                slot = min(idle, key=lambda s: s.last_used)
            keep = slot.reusable(job.prompt) if job.cache_prompt else 0
            ckpts = self.checkpoints[slot.id]
            if engine.recurrent:   # a recurrent state resumes only where it was saved
                keep = ckpts.resume(engine, keep, len(slot.cache))
            slot.begin(job, self.tokenizer, keep)
            engine.reset(slot.id, keep)
            ckpts.plan(job.prompt, keep, self.tokenizer.token_types)
            self.metrics.prompt_tokens_cached += keep

    def _prefill(self, engine) -> None:
        # while other slots generate, one micro-batch of prompt a step, so a long prompt delays
        # their next token by one micro-batch, not a whole batch
        budget = engine.n_ubatch if any(s.generating for s in self.slots) else engine.n_batch
        for s in sorted((s for s in self.slots if s.prefilling), key=lambda s: s.t_start):
            # whole micro-batches, so a prompt is cut the same way whatever else is running
            ckpts = self.checkpoints[s.id]
            while s.prefilling and budget > 0:
                stop = ckpts.next_stop(len(s.cache))   # read up to the next checkpoint, then save it
                chunk = s.pending[:min(engine.n_ubatch, stop - len(s.cache)) if stop else engine.n_ubatch]
                t0 = time.perf_counter()
                try:
                    logits = engine.eval(chunk, seq_id=s.id)
                except Exception as exc:
                    self._fail(engine, [s], exc)
                    break
                self.metrics.add_prompt(len(chunk), time.perf_counter() - t0)
                s.cache.extend(chunk)
                del s.pending[:len(chunk)]
                ckpts.reached(engine, len(s.cache))
                budget -= len(chunk)
                if not s.pending:
                    self._guarded(engine, s, s.prefilled, logits)
            if budget <= 0:
                return

    def _decode(self, engine) -> None:
        active = [s for s in self.slots if s.generating]
        for i in range(0, len(active), engine.n_ubatch):
            batch = active[i:i + engine.n_ubatch]
            t0 = time.perf_counter()
            pairs = [(s.id, s.next_token) for s in batch]
            # the GPU picks each row's best logits where every slot's sampler can draw from them,
            # after applying their logit bias, penalties and DRY to the rows
            top = len(batch) <= engine.candidate_rows and all(
                s.sampler.takes_candidates(CANDIDATES, adjusted=True) and s.job.logprobs is None for s in batch)
            adjust = [s.sampler.adjustments() if top else None for s in batch]
            top = top and all(a is None or len(a) <= ADJUST_CAP for a in adjust)
            try:
                out = engine.decode_candidates(pairs, adjust) if top else engine.decode(pairs)
            except Exception as exc:
                self._fail(engine, batch, exc)
                continue
            self.metrics.add_decode(len(batch), time.perf_counter() - t0)
            for k, s in enumerate(batch):
                s.fed()
                if top:
                    self._guarded(engine, s, lambda c, s=s: s.sample(top=c), (out[0][k], out[1][k]))
                else:
                    self._guarded(engine, s, s.sample, out[k])

    def _guarded(self, engine, slot: Slot, step, logits) -> None:
        """Sampling and text for one slot: a failure there ends that request only."""
        try:
            step(logits)
        except Exception as exc:
            log.exception("slot %d: sampling failed", slot.id)
            self._fail(engine, [slot], exc)

    def _fail(self, engine, slots: list[Slot], exc: Exception) -> None:
        """End these slots' requests with a 500 and forget their cache (their cells may be half written)."""
        log.error("generation failed on slot(s) %s: %s", ", ".join(str(s.id) for s in slots), exc)
        for s in slots:
            if s.job is None:
                continue
            s.job.emit(Failed(500, f"generation failed: {type(exc).__name__}: {exc}"))
            engine.reset(s.id)
            self.checkpoints[s.id].drop(engine)
            s.cache = []
            s.release()
            self.metrics.requests_failed += 1

    def _fail_remaining(self) -> None:
        with self._cond:
            jobs = list(self._queue) + [s.job for s in self.slots if s.job is not None]
            self._queue.clear()
        for job in jobs:
            job.emit(Failed(503, "the server is shutting down"))
        for s in self.slots:
            s.release()

    # -- views for /slots and /metrics (read from the event loop) ----------------------------------
    def slot_info(self) -> list[dict]:
        out = []
        for s in self.slots:
            job = s.job  # read once: the scheduler thread may release the slot meanwhile
            out.append({"id": s.id, "n_ctx": s.n_ctx, "is_processing": job is not None,
                        "state": "idle" if job is None else "prefill" if s.pending else "generating",
                        "n_cached": len(s.cache), "n_decoded": len(s.generated),
                        "n_checkpoints": len(self.checkpoints[s.id].saved) if self.checkpoints else 0,
                        "id_task": job.id if job is not None else None})
        return out

    def kv_tokens(self) -> int:
        return sum(len(s.cache) for s in self.slots)

    def counts(self) -> tuple[int, int]:
        """(requests holding a slot, requests waiting for one)."""
        return sum(not s.idle for s in self.slots), len(self._queue)
