"""The slot scheduler: one thread owns the engine (loads it, runs every GPU step, closes it).

Each iteration runs the slot actions asked for (slot_files.py), admits queued jobs to idle slots
(the slot holding the longest prefix of the prompt wins, or the prompt cache in host RAM:
prompt_cache.py; both outside the lock the event loop queues requests under, and while slots
generate for at most ADMIT_SECONDS an iteration), then runs one step (continuous batching): the next token of every generating
slot and, in the same micro-batch, the pending prompts (Engine.mixed): those that fit whole, then
chunks of longer ones, oldest request first.
While slots generate, a step takes only as much prompt as keeps it within max_itl_ratio times a
decode step's time, so a long prompt arriving slows the other streams by a bounded factor; not
where the experts live in host memory: a step carrying prompt streams them whatever its size,
so it reads a whole micro-batch (small chunks would each pay the stream).
Models with a recurrent state read prompts in steps of their own before the decode step (a
micro-batch an iteration while slots generate): their DeltaNet layers read a step as equal runs of
tokens, a sequence each, so a step reads several slots' prompts in runs of one length
(prompt_runs), and prompts arriving together cost one pass over the weights, not one each.
An embeddings request takes an idle slot too (its cached prefix is dropped) and reads one input
an iteration there, in steps of its own (no output matrix), before the generation step.
A prompt's image (its tokens are the image's placeholder ids, model/media_prompt.py) is read in
steps of its own too, rows of input embeddings (engine/media.py), before the generation step;
text runs stop at it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from typing import Callable

from ..engine.grammar import GrammarError
from ..engine.media import read_image
from ..engine.pooling import pool
from ..engine.readback import ADJUST_CAP, CANDIDATES
from ..engine.step_inputs import PAD_STEP
from ..errors import VkrtError
from ..model.media_prompt import MediaPrompt
from .checkpoints import SlotCheckpoints
from .jobs import Embedded, EmbeddingJob, Failed, Job
from .metrics import Metrics
from .prompt_cache import PromptCache
from .slots import Slot, text_ahead

log = logging.getLogger("vkrt.server")

EMA = 0.2   # weight of the newest step in the running step-cost estimates
ADMIT_SECONDS = 0.05   # while slots generate: admissions (prompt-cache copies) an iteration stop past this
STUCK_SECONDS = 60.0   # an iteration with work this long (or ten times the slowest so far) is stuck: /health says so


def prompt_runs(limits: list[int], cap: int) -> tuple[int, int]:
    """(slots, run length) of a recurrent model's prompt step: limits are the waiting slots'
    longest next runs, oldest first; the step reads `run` tokens of each of the first `slots`
    slots whose limit reaches it, at most `cap` in all. The oldest slot is always among them; of
    the run lengths up to its limit, the one that reads the most tokens wins (a tie: the shorter,
    which moves more slots)."""
    best = (0, 0, 0)
    for run in sorted({min(n, limits[0], cap) for n in limits}):
        slots = min(sum(n >= run for n in limits), cap // run)
        if slots * run > best[0]:
            best = (slots * run, slots, run)
    return best[1], best[2]


class SchedulerClosed(VkrtError):
    """The server is shutting down or its model failed to load."""


class Scheduler:
    def __init__(self, load: Callable, n_parallel: int, metrics: Metrics,
                 on_ready: Callable[[object], None] = lambda backend: None,
                 on_failed: Callable[[BaseException], None] = lambda exc: None, ctx_checkpoints: int = 0,
                 max_itl_ratio: float = 2.0, cache_ram: int | None = 0):
        self._load, self._on_ready, self._on_failed = load, on_ready, on_failed
        self.prompt_cache = PromptCache(cache_ram)   # bytes (None: no limit, 0: off)
        self._calls: collections.deque = collections.deque()   # (fn, future): run on the thread between steps
        self.n_parallel = n_parallel
        self.ctx_checkpoints = ctx_checkpoints
        self.max_itl_ratio = max_itl_ratio   # 0: no limit (whole micro-batches of prompt)
        self._decode_cost = self._token_cost = None   # seconds: a decode step, a token of a mixed step
        self.metrics = metrics
        self.backend = None
        self.drafting = None   # speculative decoding (engine/drafting.py), from the backend
        self.slots: list[Slot] = []
        self.checkpoints: list[SlotCheckpoints] = []
        self._queue: collections.deque[Job] = collections.deque()
        self._admitting: list[Job] = []   # jobs taken from the queue this iteration, being given slots
        self._cond = threading.Condition()
        self._stopping = False
        self._accepting = True
        self._thread = threading.Thread(target=self._main, name="vkrt-scheduler", daemon=True)
        self._beat = time.monotonic()   # when the thread last began an iteration or went idle
        self._slowest = 0.0             # the longest iteration so far, seconds

    def start(self) -> None:
        self._thread.start()

    # -- called from the event loop ----------------------------------------------------------------
    def submit(self, job: Job) -> None:
        with self._cond:
            if not self._accepting or self._stopping:
                raise SchedulerClosed("the server is shutting down")
            if not self.busy:   # the thread wakes from idle: the stuck clock starts now
                self._beat = time.monotonic()
            self._queue.append(job)
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        with self._cond:
            job.cancelled = True
            self._cond.notify()

    def call(self, fn: Callable) -> concurrent.futures.Future:
        """Run fn(engine) on the scheduler thread between steps (a slot action); the future
        holds its result or exception."""
        future = concurrent.futures.Future()
        with self._cond:
            if self._stopping or not self._accepting or not self.alive:
                raise SchedulerClosed("the server is shutting down")
            self._calls.append((fn, future))
            self._cond.notify()
        return future

    def _run_calls(self, engine, calls: collections.deque) -> None:
        while calls:
            fn, future = calls.popleft()
            try:
                future.set_result(fn(engine))
            except Exception as exc:
                future.set_exception(exc)

    @property
    def busy(self) -> bool:
        return bool(self._queue) or bool(self._admitting) or any(not s.idle for s in self.slots)

    def stop_accepting(self) -> None:
        with self._cond:
            self._accepting = False

    def cancel_all(self, message: str = "the server is shutting down") -> None:
        """Every queued and running job ends with a 503 at the next iteration."""
        with self._cond:
            for job in list(self._queue) + self._admitting + [s.job for s in self.slots if s.job is not None]:
                job.cancelled = True
                job.emit(Failed(503, message))
            self._cond.notify()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

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
            if self.max_itl_ratio and (engine.recurrent or engine.host_experts):
                log.info("--max-itl-ratio %g does not apply to this model: %s, so a step carrying prompt reads a "
                         "whole micro-batch (one an iteration while slots generate)", self.max_itl_ratio,
                         "its experts stream from host memory in every prompt step" if engine.host_experts
                         else "its recurrent state reads prompts in steps of their own")
            self.drafting = getattr(self.backend, "drafting", None)
            for s in self.slots:
                s.drafter = self.drafting.drafter(s.id) if self.drafting is not None else None
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
            while not self._stopping and not self._queue and not self._calls and all(s.idle for s in self.slots):
                self._cond.wait()
            if self._stopping:
                return False
            self._beat = t0 = time.monotonic()
            calls, self._calls = self._calls, collections.deque()
            self._drop_cancelled()
            self._admitting, self._queue = list(self._queue), collections.deque()
        # slot actions and admissions (prompt-cache copies) run outside the lock: the event loop
        # takes it to queue a request and must never wait on a copy
        self._run_calls(engine, calls)
        self._admit(engine)
        self._embed(engine)
        self._images(engine)
        if engine.recurrent:
            self._prefill(engine)
            self._decode(engine)
        else:
            self._step(engine)
        self._slowest = max(self._slowest, time.monotonic() - t0)
        return True

    def stuck(self) -> str | None:
        """Why the server is stuck (an iteration holding work has run past STUCK_SECONDS, or ten
        times the slowest one so far; the thread died), else None. Read from the event loop."""
        if self.backend is not None and not self._thread.is_alive() and not self._stopping:
            return "the scheduler thread has stopped"
        if not self.busy:
            return None
        limit = max(STUCK_SECONDS, 10 * self._slowest)
        running = time.monotonic() - self._beat
        if running > limit:
            return f"a step has run for {running:.0f} s (the limit is {limit:.0f} s): the device or scheduler is stuck"
        return None

    def _drop_cancelled(self) -> None:
        waiting = len(self._queue)
        self._queue = collections.deque(j for j in self._queue if not j.cancelled)
        self.metrics.requests_cancelled += waiting - len(self._queue)
        for s in self.slots:
            if s.job is not None and s.job.cancelled:
                self.metrics.requests_cancelled += 1
                s.release()

    def _admit(self, engine) -> None:
        """Give the jobs taken from the queue (self._admitting, oldest first) idle slots; those
        left (no idle slot, their id_slot busy, or the admission budget spent) go back to the
        queue's front. While slots generate, admissions stop once they have taken ADMIT_SECONDS
        this iteration (prompt-cache copies; at least one job is admitted): a crowd of requests
        arriving together delays the streams by a bounded time an iteration, not all of theirs."""
        jobs = collections.deque(self._admitting)
        held = []   # jobs whose slot (id_slot) is busy: they wait, the jobs behind them go ahead
        t0, generating = time.perf_counter(), any(s.generating for s in self.slots)
        try:
            self._admit_jobs(engine, jobs, held, t0, generating)
        finally:
            with self._cond:
                self._queue.extendleft(reversed(held + list(jobs)))
                self._admitting = []

    def _admit_jobs(self, engine, jobs: collections.deque, held: list, t0: float, generating: bool) -> None:
        admitted = 0
        while jobs:
            idle = [s for s in self.slots if s.idle]
            if not idle or (generating and admitted and time.perf_counter() - t0 > ADMIT_SECONDS):
                break
            job = jobs.popleft()
            if job.cancelled:
                self.metrics.requests_cancelled += 1
                continue
            admitted += 1
            if isinstance(job, EmbeddingJob):   # _embed runs it on the slot's sequence
                slot = min(idle, key=lambda s: s.last_used)
                self.prompt_cache.save(engine, slot, self.checkpoints[slot.id])
                slot.job = job
                continue
            if job.id_slot >= 0:
                idle = [s for s in idle if s.id == job.id_slot]
                if not idle:
                    held.append(job)
                    continue
            slot, keep = self.prompt_cache.admit(engine, job, idle, self.checkpoints)
            slot.begin(job, self.tokenizer, keep, job.constraint)
            engine.reset(slot.id, keep)
            self.checkpoints[slot.id].plan(job.prompt, keep, self.tokenizer.token_types)
            self.metrics.prompt_tokens_cached += keep

    def _embed(self, engine) -> None:
        """The next input of each embedding job holding a slot: its hidden states on the slot's
        sequence, read from an empty cache (and forgotten after), pooled; the job's result once
        every input is done."""
        for s in self.slots:
            job = s.job
            if not isinstance(job, EmbeddingJob):
                continue
            tokens = job.inputs[len(job.done)]
            t0 = time.perf_counter()
            try:
                self._clear(engine, s)
                job.done.append(pool(engine.hidden_states(tokens, seq_id=s.id), job.pooling))
                self._clear(engine, s)
            except Exception as exc:
                self._fail(engine, [s], exc)
                continue
            self.metrics.add_prompt(len(tokens), time.perf_counter() - t0)
            if len(job.done) == len(job.inputs):
                job.emit(Embedded(job.done))
                s.release()

    def _images(self, engine) -> None:
        """Each slot whose prompt goes on with an image: the image's rows from there to its end,
        in steps of their own (as llama.cpp reads an image chunk); sampled if the prompt ends there."""
        for s in self.slots:
            if not s.prefilling or s.pending[0] >= 0:
                continue
            t0 = time.perf_counter()
            try:
                logits, n = read_image(engine, MediaPrompt(s.job.prompt, s.job.images), s.id, len(s.cache))
            except Exception as exc:
                self._fail(engine, [s], exc)
                continue
            self.metrics.add_prompt(n, time.perf_counter() - t0)
            s.cache.extend(s.pending[:n])
            del s.pending[:n]
            self.checkpoints[s.id].reached(engine, len(s.cache))
            if not s.pending:
                self._guarded(engine, s, s.prefilled, logits)

    def _clear(self, engine, slot: Slot) -> None:
        """Forget what the slot's sequence holds."""
        engine.reset(slot.id)
        self.checkpoints[slot.id].drop(engine)
        slot.cache = []

    def _prefill(self, engine) -> None:
        """A recurrent model's prompt steps: while other slots generate, one micro-batch of prompt
        an iteration, so a long prompt delays their next token by one micro-batch, not a batch."""
        budget = engine.n_ubatch if any(s.generating for s in self.slots) else engine.n_batch
        while budget > 0:
            waiting = sorted((s for s in self.slots if s.prefilling and text_ahead(s.pending)), key=lambda s: s.t_start)
            if not waiting:
                return
            # runs end at a checkpoint's position, so the state there can be saved (and before an image)
            limits = []
            for s in waiting:
                stop = self.checkpoints[s.id].next_stop(len(s.cache))
                limits.append(min(text_ahead(s.pending), engine.n_ubatch,
                                  stop - len(s.cache) if stop else engine.n_ubatch))
            n, run = prompt_runs(limits, min(budget, engine.n_ubatch))
            group = [s for s, limit in zip(waiting, limits) if limit >= run][:n]
            if not self._prompt_step(engine, group, run):
                return
            budget -= n * run

    def _prompt_step(self, engine, group: list[Slot], run: int) -> bool:
        """`run` prompt tokens of each slot of `group` in one step; whether it ran."""
        sampled = [s if len(s.pending) == run else None for s in group]   # those whose prompt ends here
        top, adjust, masks = self._candidates(engine, sampled)
        t0 = time.perf_counter()
        try:
            out = engine.mixed([(s.id, s.pending[:run]) for s in group], adjust, top=top, masks=masks)
        except Exception as exc:
            self._fail(engine, group, exc)
            return False
        seconds = time.perf_counter() - t0
        self.metrics.add_prompt(run * len(group), seconds)
        log.debug("prompt step: %d slot(s) x %d token(s), %.0f ms", len(group), run, seconds * 1e3)
        for k, s in enumerate(group):
            s.cache.extend(s.pending[:run])
            del s.pending[:run]
            self.checkpoints[s.id].reached(engine, len(s.cache))
            if not s.pending:
                self._sampled(engine, s, s.prefilled, out, k, top)
        return True

    def _step(self, engine) -> None:
        """One step: every generating slot's next token and as much pending prompt as fits."""
        gen = [s for s in self.slots if s.generating]
        room = self._step_tokens(engine, len(gen)) - len(gen)
        prompts = []
        waiting = sorted((s for s in self.slots if s.prefilling), key=lambda s: s.t_start)
        # prompts that fit whole first (a short one does not wait behind a long one's chunks), oldest first;
        # a chunk ends before an image (read in steps of its own: _images)
        for s in [s for s in waiting if len(s.pending) <= room] + [s for s in waiting if len(s.pending) > room]:
            if room <= 0:
                break
            chunk = s.pending[:min(room, text_ahead(s.pending))]
            if chunk:
                prompts.append((s, chunk))
                room -= len(chunk)
        if not prompts:
            self._decode(engine)
            return
        parts = [(s.id, [s.next_token]) for s in gen] + [(s.id, chunk) for s, chunk in prompts]
        # the rows sampled this step: the decode tokens' and those of prompts read to their end
        sampled = gen + [s if len(chunk) == len(s.pending) else None for s, chunk in prompts]
        top, adjust, masks = self._candidates(engine, sampled)
        t0, recording = time.perf_counter(), engine.stats.record_seconds
        try:
            out = engine.mixed(parts, adjust, top=top, masks=masks)
        except Exception as exc:
            self._fail(engine, gen + [s for s, _ in prompts], exc)
            return
        seconds = time.perf_counter() - t0
        run = seconds - (engine.stats.record_seconds - recording)   # a new shape's recording is no step cost
        n_prompt = sum(len(chunk) for _, chunk in prompts)
        log.debug("mixed step: %d decode + %d prompt token(s) of %d slot(s), %.0f ms (recording %.0f ms)",
                  len(gen), n_prompt, len(prompts), seconds * 1e3, (seconds - run) * 1e3)
        share = n_prompt / (n_prompt + len(gen))   # the step's time is counted by token
        self.metrics.add_prompt(n_prompt, seconds * share)
        if gen:
            self.metrics.add_decode(len(gen), seconds * (1 - share))
        per = run / engine.padded_tokens(n_prompt + len(gen))
        self._token_cost = per if self._token_cost is None else (1 - EMA) * self._token_cost + EMA * per
        for k, s in enumerate(gen):
            s.fed()
            self._sampled(engine, s, s.sample, out, k, top)
        for k, (s, chunk) in enumerate(prompts, len(gen)):
            s.cache.extend(chunk)
            del s.pending[:len(chunk)]
            if not s.pending:
                self._sampled(engine, s, s.prefilled, out, k, top)

    def _step_tokens(self, engine, n_generating: int) -> int:
        """Tokens a step may hold: the micro-batch; with slots generating and max_itl_ratio set,
        as many as keep the step's estimated time (a mixed step's measured cost a token) within
        max_itl_ratio decode steps, in whole PAD_STEPs, and at least one prompt token. With host
        experts, the micro-batch: the stream they cost a step has no share a token."""
        if not n_generating or not self.max_itl_ratio or engine.host_experts or not self._token_cost \
                or self._decode_cost is None:
            return engine.n_ubatch
        n = self.max_itl_ratio * self._decode_cost / self._token_cost
        least = (n_generating // PAD_STEP + 1) * PAD_STEP
        return min(engine.n_ubatch, max(least, int(n) // PAD_STEP * PAD_STEP))

    def _candidates(self, engine, slots: list) -> tuple[bool, list, list | None]:
        """Whether the GPU's best candidates serve the samplers of these rows (None: a row nobody
        samples), and each row's logit adjustments (bias, penalties, DRY) and grammar mask for
        the GPU to apply (masks: None without candidates)."""
        live = [s for s in slots if s is not None]
        top = len(slots) <= engine.candidate_rows and all(
            s.sampler.takes_candidates(CANDIDATES, adjusted=True) and s.job.logprobs is None for s in live)
        adjust = [s.sampler.adjustments() if top and s is not None else None for s in slots]
        top = top and all(a is None or len(a) <= ADJUST_CAP for a in adjust)
        masks = [s.mask() if s is not None else None for s in slots] if top else None
        return top, adjust, masks

    def _decode(self, engine) -> None:
        active = [s for s in self.slots if s.generating]
        if self.drafting is not None and active and self._speculate(engine, active):
            return
        for i in range(0, len(active), engine.n_ubatch):
            batch = active[i:i + engine.n_ubatch]
            t0, recording = time.perf_counter(), engine.stats.record_seconds
            pairs = [(s.id, s.next_token) for s in batch]
            top, adjust, masks = self._candidates(engine, batch)
            try:
                out = engine.decode_candidates(pairs, adjust, masks) if top else engine.decode(pairs)
            except Exception as exc:
                self._fail(engine, batch, exc)
                continue
            seconds = time.perf_counter() - t0
            self.metrics.add_decode(len(batch), seconds)
            log.debug("decode step: %d token(s), %.1f ms", len(batch), seconds * 1e3)
            if len(batch) == len(active):
                run = seconds - (engine.stats.record_seconds - recording)
                self._decode_cost = run if self._decode_cost is None else (1 - EMA) * self._decode_cost + EMA * run
            for k, s in enumerate(batch):
                s.fed()
                self._sampled(engine, s, s.sample, out, k, top)

    def _speculate(self, engine, active: list[Slot]) -> bool:
        """One verification step (vkrt/engine/speculative.py) for the generating slots, when any
        has drafts or accepted tokens to replay; whether it ran. Each slot's part is its replay,
        its next token and its drafts; with a recurrent state the parts are made one length with
        drafts no slot relies on (the rows past its own drafts are not read), and each slot's
        state is snapshot first. Drafts go to slots without a grammar, log-probabilities or
        adjustments (their rows are sampled as they come); the others take one token as in a
        decode step. Rejected tails are taken back (Engine.truncate)."""
        top, adjust, masks = self._candidates(engine, active)
        cap = min(engine.candidate_rows if top else engine.n_ubatch, max(engine.verify_tokens, len(active)))
        each = cap // len(active)   # rows a slot may take
        o = self.drafting.options
        plan, wanted = [], []   # wanted: (plan index, the slot's fewest drafts, its draft request)
        for s in active:
            lead = s.replay + [s.next_token]
            n_max, n_min, p_min = (x if x is not None else d for x, d in
                                   zip(s.job.draft or (None,) * 3, (o.draft_max, o.draft_min, o.p_min)))
            if s.drafter is not None and s.grammar is None and s.job.logprobs is None \
                    and (not s.job.images or getattr(s.drafter, "takes_images", False)) \
                    and not s.sampler.params.needs_row and len(s.replay) <= o.draft_max:
                room = min(n_max, each - len(lead), s.limit - len(s.generated) - 1,
                           s.n_ctx - len(s.cache) - len(lead))
                if room > 0:
                    if hasattr(s.drafter, "p_min"):   # a draft model or MTP head: the request's confidence floor
                        s.drafter.p_min, s.drafter.n_min = p_min, n_min
                    wanted.append((len(plan), n_min, (s.drafter, s.job.prompt + s.generated, room)))
            plan.append((s, lead, []))
        for (k, n_min, (_, _, room)), drafts in zip(wanted, self.drafting.draft_all([w for _, _, w in wanted])):
            drafts = [int(t) for t in drafts[:room]]
            plan[k] = (plan[k][0], plan[k][1], drafts if len(drafts) >= max(1, n_min) else [])
        if not any(d or len(lead) > 1 for _, lead, d in plan):
            return False

        def rows_needed() -> int:
            sizes = [len(lead) + len(d) for _, lead, d in plan]
            return max(sizes) * len(sizes) if engine.recurrent else sum(sizes)
        if rows_needed() > cap:   # replays longer than a slot's share (more slots came): no drafts this step
            plan = [(s, lead, []) for s, lead, _ in plan]
        if top and rows_needed() > engine.candidate_rows:   # whole rows, sampled (and adjusted) on the host
            top, adjust, masks = False, [None] * len(plan), None
        longest = max(len(lead) + len(d) for _, lead, d in plan)
        parts, rows, row_adjust, row_masks = [], [], [], []
        for k, (s, lead, drafts) in enumerate(plan):
            tail = drafts + ([lead[-1]] * (longest - len(lead) - len(drafts)) if engine.recurrent else [])
            if tail:
                engine.snapshot(s.id)
            parts.append((s.id, lead + tail))
            rows.append(1 + len(tail))
            row_adjust += [adjust[k]] + [None] * len(tail)
            if masks is not None:
                row_masks += [masks[k]] + [None] * len(tail)
        t0 = time.perf_counter()
        try:
            out = engine.mixed(parts, row_adjust if top else None, top=top, masks=row_masks if top and masks else None,
                               rows=rows)
        except Exception as exc:
            self._fail(engine, active, exc)
            return True
        seconds = time.perf_counter() - t0
        first, produced = 0, 0
        for (s, lead, drafts), n_rows in zip(plan, rows):
            base, i = len(s.cache), 0
            while True:
                self._sampled(engine, s, s.sample, out, first + i, top)
                produced += 1
                if s.job is None or i >= len(drafts) or s.next_token != drafts[i]:
                    break
                i += 1
            first += n_rows
            if s.job is not None or engine.sequence_length(s.id) > base:   # not failed (that forgot the sequence)
                fed = lead + drafts[:i]
                kept = engine.truncate(s.id, base + len(fed))
                s.cache.extend(fed[:kept - base])
                s.replay = fed[kept - base:] if s.job is not None else []
            s.timings.draft_n += len(drafts)
            s.timings.draft_n_accepted += i
            self.metrics.add_draft(len(drafts), i)
        self.metrics.add_decode(len(plan), seconds)
        log.debug("verification step: %d slot(s), %d row(s), %d token(s) generated, %.1f ms", len(plan), sum(rows),
                  produced, seconds * 1e3)
        return True

    def _sampled(self, engine, slot: Slot, step, out, k: int, top: bool) -> None:
        """step(row k of a step's output) guarded: from the candidates when top, else the logits row."""
        if top:
            self._guarded(engine, slot, lambda c: step(top=c), (out[0][k], out[1][k]))
        else:
            self._guarded(engine, slot, step, out[k])

    def _guarded(self, engine, slot: Slot, step, logits) -> None:
        """Sampling and text for one slot: a failure there ends that request only."""
        try:
            step(logits)
        except GrammarError as exc:   # the request's grammar came to a dead end: its fault, not the server's
            log.info("slot %d: the request's grammar ended it: %s", slot.id, exc)
            self._fail(engine, [slot], exc, status=400)
        except Exception as exc:
            log.exception("slot %d: sampling failed", slot.id)
            self._fail(engine, [slot], exc)

    def _fail(self, engine, slots: list[Slot], exc: Exception, status: int = 500) -> None:
        """End these slots' requests with a 500 (a 400: the request's grammar refused every token)
        and forget their cache (their cells may be half written)."""
        if status == 500:
            log.error("generation failed on slot(s) %s: %s", ", ".join(str(s.id) for s in slots), exc)
        message = f"the grammar stopped generation: {exc}" if status == 400 else \
            f"generation failed: {type(exc).__name__}: {exc}"
        for s in slots:
            if s.job is None:
                continue
            s.job.emit(Failed(status, message))
            engine.reset(s.id)
            self.checkpoints[s.id].drop(engine)
            s.cache = []
            s.release()
            self.metrics.requests_failed += 1

    def _fail_remaining(self) -> None:
        with self._cond:
            jobs = list(self._queue) + [s.job for s in self.slots if s.job is not None]
            self._queue.clear()
            self._accepting = False   # and no more slot actions
            for _, future in self._calls:
                future.set_exception(SchedulerClosed("the server is shutting down"))
            self._calls.clear()
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
                        "speculative": self.drafting is not None,
                        "id_task": job.id if job is not None else None})
        return out

    def kv_tokens(self) -> int:
        return sum(len(s.cache) for s in self.slots)

    def counts(self) -> tuple[int, int]:
        """(requests holding a slot, requests waiting for one)."""
        return sum(not s.idle for s in self.slots), len(self._queue)
