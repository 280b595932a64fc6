"""Batched lossless speculative generation with an MTP draft head, or with drafts from the rollouts' own text
(`drafter="suffix"`: engine/suffix_drafter.py, any model, no head) (docs/method.md section 3).

    gens, metrics = speculative_generate(model, prompts, k=3, mode="rs", max_new_tokens=128,
                                         sampling=SamplingParams(1.0), stop_ids=[eos], generator=g)
    gens, metrics = speculative_generate(model, prompts, k="auto", max_k=6, mode="rs", ...)

The prompts are prefilled once per distinct prompt, the head's cache with them (engine/prefill.py);
the first step feeds each prompt's last token and samples plainly. Then one step, for every live row at once:
  0. choose k: fixed, or with k="auto" the k in [0, max_k] that maximises expected emitted tokens
     per second for the current number of live rows (bebop.engine.adaptive); k = 0 is a plain step.
  1. refresh + draft (k > 0): the MTP head consumes the trunk hiddens of every position made valid
     since its last refresh (one ragged chunk per row, however many plain steps were skipped;
     bebop.engine.refresh_log), whose last position gives depth 1, then drafts depths 2..k one
     token at a time. RS samples y_d ~ q_d; TO takes argmax q_d.
  2. verify: ONE trunk forward over [x_last, y_1..y_k] gives the target rows p_1..p_{k+1}.
  3. accept with `rejection_sample` or `target_only_sample` (lossless), emit 1..k+1 tokens;
     stop tokens and max_new_tokens truncate inside the accepted run (RowBook).
  4. roll both caches back to the valid lengths (a length change, no copy: the verify drops the
     rejected drafts and the drafting chain its drafts, and the host sets a length only where a stop
     cut a run short); rows that finished leave the batch once they are 1/COMPACT_EVERY of it (the
     caches keep only live rows), so later steps cost about the live rows only.
A row whose next input is an environment observation (agent task) feeds it as a prefill in the
same verify forward and samples plainly for that step; drafting resumes on the next step.
Exactly one device->host transfer per step (the emitted tokens and their log-probs).

Seeds: as in plain generation, one generator serves the whole batch, so output is reproducible
for a given seed, prompts, batch and settings; at temperature 0 it equals plain greedy decoding
token for token, whatever the head and whatever k each step verifies.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from bebop.engine.adaptive import AdaptiveK
from bebop.engine.compiled import EagerSteps, compile_seconds, prepared_steps
from bebop.engine.generate import cache_capacity, check_prompts, live_rows, prefill_prompts, rows_to_keep
from bebop.engine.metrics import SpecMetrics, count_draft
from bebop.engine.records import Generation
from bebop.engine.refresh_log import RefreshLog
from bebop.engine.rows import Observer, RowBook
from bebop.engine.spec_step import step_draws
from bebop.engine.step_costs import drafter_costs
from bebop.engine.suffix_drafter import DRAFTERS, MIN_MATCH, SourceChooser, SuffixDrafter, index_for, point_mass_drafts
from bebop.engine.suffix_index import SuffixIndex
from bebop.errors import BebopError
from bebop.model.host_tensor import host_tensor, pad_chunk
from bebop.model.packed_linear import decoding
from bebop.model.qwen3 import CausalLM
from bebop.sampling import SamplingParams
from bebop.sampling.warp import read_host

SPEC_MODES = ("to", "rs")
MAX_K = 8
DEFAULT_MAX_K = 6
AUTO = "auto"
LOG_LIMIT = 1 << 24  # logged hidden elements (rows x positions x H) before a refresh is forced


def check_spec(mode: str, k: int | str, max_k: int = DEFAULT_MAX_K) -> None:
    if mode not in SPEC_MODES:
        raise BebopError(f"unknown speculative mode {mode!r}; choose from {', '.join(SPEC_MODES)}")
    if k == AUTO:
        if not isinstance(max_k, int) or not 1 <= max_k <= MAX_K:
            raise BebopError(f"--max-k must be in [1, {MAX_K}], got {max_k}")
    elif isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise BebopError(f"K (drafts per step) must be 'auto' or in [1, {MAX_K}], got {k}")


def parse_k(text: str | int) -> int | str:
    """A --k value: 'auto' or a number of drafts per step."""
    if text == AUTO or isinstance(text, int):
        return text
    try:
        return int(text)
    except ValueError:
        raise BebopError(f"--k must be 'auto' or an integer in [1, {MAX_K}], got {text!r}") from None


def check_spec_flags(spec: str, k: int | str, max_k: int) -> None:
    """The command-line combination: --spec off|to|rs with --k and --max-k."""
    if spec == "off":
        if k == AUTO:
            raise BebopError("--k auto chooses how many drafts to verify: it needs --spec to or --spec rs")
        return
    check_spec(spec, k, max_k)


def _draft(steps: EagerSteps, model: CausalLM, mtp_cache, ref_hidden: torch.Tensor, ref_tokens: torch.Tensor,
           ref_count: torch.Tensor, k: int, mode: str, sampling: SamplingParams, draws: torch.Tensor, rows: list[int]
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's drafter (`steps`: the run's step functions): refresh the MTP cache with the pending positions,
    then draft k tokens (k = 0: refresh only).

    ref_hidden (R, W, H), ref_tokens (R, W), ref_count (R,); draws (R, k) float64 uniforms; rows: each row's
    prompt index (for a test's drafter) -> drafts (R, k), draft_probs (R, k, V)."""
    return steps.draft_chain(model, mtp_cache, ref_hidden, ref_tokens, ref_count, draws, k=k, mode=mode,
                             sampling=sampling)


_HEAD_DRAFT = _draft  # while `_draft` is this, a step drafting with the head runs whole (a test puts an oracle there)


@torch.inference_mode()
@decoding()
def speculative_generate(model: CausalLM, prompts: Sequence[Sequence[int]], *, k: int | str, mode: str,
                         max_new_tokens: int, sampling: SamplingParams = SamplingParams(),
                         stop_ids: Sequence[int] = (), generator: torch.Generator | None = None, pad_id: int = 0,
                         observer: Observer | None = None, interrupt_ids: Sequence[int] = (),
                         max_observation_tokens: int = 64, max_k: int = DEFAULT_MAX_K,
                         controller: AdaptiveK | None = None, log_drafts: bool = False, drafter: str = "mtp",
                         index: SuffixIndex | None = None) -> tuple[list[Generation], SpecMetrics]:
    """`controller`: with k="auto", an AdaptiveK to reuse across calls (RL keeps one per run so its
    acceptance estimate follows the policy); by default a fresh one over the model's cached costs.
    `log_drafts`: keep every verified draft's (depth, target entropy, accepted, prompt index) in
    metrics.draft_log. `drafter`: "mtp" (the model's head), "suffix" (the rollouts' own text: `index`, kept by
    the caller across calls so that earlier responses to the same prompts draft too; by default this call's) or
    "both" (per row, the index's continuation where its match is long, else the head's draft)."""
    check_spec(mode, k, max_k)
    check_drafter(drafter)
    if drafter != "suffix":
        model.require_mtp()
    check_prompts(prompts, model.config.max_position_embeddings, model.config.vocab_size)
    if k == AUTO and controller is None:
        controller = AdaptiveK(max_k, drafter_costs(model, drafter, max_rows=len(prompts), max_k=max_k, mode=mode,
                                                    sampling=sampling))
    run = _SpeculativeRun(model, prompts, k=max_k if isinstance(k, str) else k, mode=mode, max_new_tokens=max_new_tokens,
               sampling=sampling, stop_ids=stop_ids, generator=generator, pad_id=pad_id, observer=observer,
               interrupt_ids=interrupt_ids, max_observation_tokens=max_observation_tokens,
               controller=controller if k == AUTO else None, log_drafts=log_drafts,
               drafter=drafter, index=index_for(drafter, index), max_k=max_k)
    try:
        while run.live:
            run.step()
        if isinstance(run.controller, AdaptiveK) and run.controller.refine:
            run.controller.costs.save()  # the ratios measured here, for the next process (the kept table)
    finally:
        if run.suffix is not None:
            run.suffix.close()  # the call's rows become the index's history
    return run.book.rows, run.metrics


def check_drafter(drafter: str) -> None:
    if drafter not in DRAFTERS:
        raise BebopError(f"unknown --drafter {drafter!r}; choose from {', '.join(DRAFTERS)}")


def speculative_rollout_fn(k: int | str, mode: str, sink: list[SpecMetrics], *, max_k: int = DEFAULT_MAX_K,
                           controller: AdaptiveK | None = None, log_drafts: bool = False, drafter: str = "mtp",
                           index: SuffixIndex | None = None):
    """A generate function for rollout.run_episodes that drafts with `drafter` and appends each call's metrics to
    `sink` (k="auto": `controller` carries the acceptance estimate and costs across calls; a suffix drafter's
    `index` carries the earlier calls' text)."""
    check_drafter(drafter)
    index = index_for(drafter, index)  # one for every call: the earlier calls' text drafts too

    def run(model: CausalLM, prompts, **kwargs) -> list[Generation]:
        gens, metrics = speculative_generate(model, prompts, k=k, mode=mode, max_k=max_k, controller=controller,
                                             log_drafts=log_drafts, drafter=drafter, index=index, **kwargs)
        sink.append(metrics)
        return gens

    return run


class _SpeculativeRun:
    """The state of one speculative generation: the live rows (prompt index of each cache row), their
    trunk / MTP cache lengths (host copies, exact) and the positions waiting for an MTP refresh; with a suffix
    index (`index`), its drafter instead of the head's cache."""

    def __init__(self, model: CausalLM, prompts, *, k: int, mode: str, max_new_tokens: int, sampling, stop_ids,
                 generator, pad_id: int, observer, interrupt_ids, max_observation_tokens: int,
                 controller: AdaptiveK | None, log_drafts: bool = False, drafter: str = "mtp",
                 index: SuffixIndex | None = None, max_k: int = DEFAULT_MAX_K) -> None:
        cfg = model.config
        self.model, self.k, self.mode, self.sampling = model, k, mode, sampling
        self.device = model.device
        self.steps = prepared_steps(model)  # compiled when compile_steps compiled the model
        self.generator, self.pad_id, self.controller = generator, pad_id, controller
        self.book = RowBook(prompts, max_new_tokens, stop_ids, interrupt_ids, observer,
                            context=cfg.max_position_embeddings)
        # a strong match of the rollouts' text drafts up to max_k (SourceChooser.deepen)
        self.max_k = max(k, max_k) if index is not None else k
        capacity = cache_capacity(prompts, max_new_tokens, cfg.max_position_embeddings,
                                  slack=max(self.max_k + 1, max_observation_tokens + 1))
        self.live = list(range(len(prompts)))
        self.cache = model.new_cache(len(prompts), capacity)
        self.drafter = drafter
        self.suffix = SuffixDrafter(index, self.book, MIN_MATCH[drafter]) if index is not None else None
        self.chooser = SourceChooser() if index is not None else None
        # this step, per live row: the match its draft continues and the continuation's length ((0, 0): the head's)
        self.continuations: list[tuple[int, int]] = []
        # a catch-up refresh writes up to `capacity` positions past a row's MTP length: room for both
        self.mtp_cache = None if drafter == "suffix" else model.require_mtp().new_cache(
            len(prompts), 2 * capacity + self.max_k, dtype=model.dtype, device=model.device)
        self.log = RefreshLog(len(prompts))
        self.trunk_len, self.mtp_len = [0] * len(prompts), [0] * len(prompts)
        self.metrics = SpecMetrics(self.max_k, draft_log=[] if log_drafts else None)
        self._leave_finished()
        self.trunk_len = prefill_prompts(model, self.book, self.live, self.cache, steps=self.steps,
                                         mtp_cache=self.mtp_cache, pad_id=pad_id)
        self.mtp_len = list(self.trunk_len)

    def choose_k(self, can_draft: list[bool], generating: int) -> int:
        if not any(can_draft):
            return 0
        return self.controller.choose(generating) if self.controller else self.k

    def step(self) -> None:
        t0, compiling = time.perf_counter(), compile_seconds(self.model)
        generating = len(live_rows(self.book, self.live))  # the live batch less the finished riding along
        whole = None  # (hidden, results) of a step run as one call
        pending = [self.book.pending[row] for row in self.live]
        if self.drafter == "suffix":  # the text alone: no head
            k, drafting, drafts, draft_probs = self._suffix_drafts(pending, generating)
            typical = all(len(p) == 1 for p in pending if p)
            draws = step_draws(len(self.live), k, self.generator, self.device)  # (R, 2k + 2): spec_step.py
        else:
            logged = self.log.counts
            can_draft = [len(p) == 1 and c > 0 for p, c in zip(pending, logged)]  # the last token only, history logged
            k = self.choose_k(can_draft, generating)
            found = None  # both: each drafting row's continuation, where its match length has paid as the head has
            if k and self.suffix is not None:
                chooser = self.chooser
                assert chooser is not None
                found = self._proposals(self.max_k, pending, lambda i, match: can_draft[i]
                                        and chooser.prefer_suffix(match))
                k = self._deepen(k, found, generating, sum(can_draft))
            drafting = [k > 0 and d for d in can_draft]
            typical = all(len(p) == 1 for p in pending if p) and (not k or max(logged) <= self.k + 1)
            draws = step_draws(len(self.live), k, self.generator, self.device)  # (R, 2k + 2): spec_step.py
            drafts = draft_probs = None
            self.continuations = []
            if k and found is None and _draft is _HEAD_DRAFT:  # the head drafts every row: the step in one call
                whole = self._head_step(k, pending, drafting, draws)
            elif k:
                drafts, draft_probs = self._refresh(k, draws[:, :k])
                if found is not None:  # both: a row with a long match drafts its continuation instead
                    drafts, draft_probs = self._mix(found, drafts, draft_probs)
            elif self.log.positions * len(self.live) * self.model.config.hidden_size > LOG_LIMIT:
                self._refresh(0, draws[:, :0])
        hidden, host_rows = whole or self._verify(k, pending, drafting, drafts, draft_probs, draws[:, k:])
        host = read_host(host_rows)  # the step's one host sync
        whole_runs = self._emit(k, pending, drafting, host, hidden)
        # a step that compiled a graph is warm-up; so is the run's first decode step, which carries one-time work and
        # ran slower than the rest (docs/benchmarks.md): counted, it priced plain steps for the whole run
        first = not self.metrics.k_histogram  # no step recorded yet
        typical = typical and compile_seconds(self.model) == compiling and not first
        if self.controller and typical:  # a decode step with no catch-up: its time fits the cost model
            asked = [d or (self.drafter == "suffix" and len(fed) == 1) for d, fed in zip(drafting, pending)]
            self.controller.observe(generating, k, time.perf_counter() - t0,  # a row the text had nothing for: 0
                                    [int(h[-1]) if d else 0 for h, d, a in zip(host, drafting, asked) if a])
        self.metrics.record_step(generating, k)
        # the verify dropped each row's rejected drafts; the host sets a length only where a row kept less
        self.cache.rollback(self.trunk_len, span=max(self.trunk_len), current=whole_runs)
        self._leave_finished()

    def _suffix_drafts(self, pending: list[list[int]], generating: int):
        """The index's proposals for rows whose next input is their last token: the step verifies the longest, at
        most K (with --k auto, at most the controller's choice; deeper where a strong match pays, `_deepen`); a step
        where none matches is plain -> (k, drafting (R,), drafts (R, k), draft_probs (R, k, V))."""
        found = self._proposals(self.max_k, pending, lambda i, match: True)
        drafting = [bool(p) for p, _ in found]
        limit = self._deepen(self.choose_k(drafting, generating), found, generating, sum(drafting))
        proposals = [p[:limit] for p, _ in found]
        self.continuations = [(n if p else 0, len(p)) for p, (_, n) in zip(proposals, found)]
        k = max(map(len, proposals), default=0)
        drafts, draft_probs = point_mass_drafts(proposals, k, self.model.config.vocab_size, self.device)
        return k, [bool(p) for p in proposals], drafts, draft_probs

    def _deepen(self, k: int, found: list[tuple[list[int], int]], generating: int, drafting: int) -> int:
        """The step's k, deepened past `k` up to max_k where strong matches pay (SourceChooser.deepen): with --k
        auto, when the strong rows' expected extra tokens outweigh the deeper verify's predicted cost; with a fixed
        K, when at least half the drafting rows have a strong match (the deeper verify serves most of them)."""
        assert self.chooser is not None
        controller = self.controller

        def worth(deep: int, gain: float, strong_rows: int) -> bool:
            if controller is None:
                return 2 * strong_rows >= drafting
            tokens = generating * controller.acceptance.expected_tokens(k)  # the step at k, as the controller sees it
            return (tokens + gain) / controller.costs.predict(generating, deep) > tokens / controller.costs.predict(
                generating, k)

        return self.chooser.deepen(k, found, self.max_k, worth)

    def _proposals(self, k: int, pending: list[list[int]], allow) -> list[tuple[list[int], int]]:
        """The index's continuations (up to k tokens) and match lengths for the live rows whose next input is their
        last token and for which allow(row position, match length) holds; ([], 0) for the others."""
        assert self.suffix is not None
        self.suffix.sync(self.live)
        return [(p, n) if len(fed) == 1 and allow(i, n) else ([], 0)
                for i, ((p, n), fed) in enumerate(zip(self.suffix.propose(self.live, k), pending))]

    def _mix(self, found: list[tuple[list[int], int]], drafts: torch.Tensor, draft_probs: torch.Tensor):
        """The head's drafts (R, k), (R, k, V), with each drafting row whose index match is long and has paid as
        well as the head's drafts (`found`: its continuation, SourceChooser) replaced by the continuation's point
        masses. Which source a row uses depends on its text and past steps alone: lossless either way."""
        k = drafts.shape[1]
        proposals = [p[:k] for p, _ in found]
        self.continuations = [(n, len(p)) for p, (_, n) in zip(proposals, found)]
        use = torch.tensor([bool(p) for p in proposals], device=drafts.device)  # (R,)
        if not bool(use.any()):
            return drafts, draft_probs
        mass_drafts, mass_probs = point_mass_drafts(proposals, k, draft_probs.shape[-1], drafts.device)
        return (torch.where(use[:, None], mass_drafts, drafts),
                torch.where(use[:, None, None], mass_probs.to(draft_probs.dtype), draft_probs))

    def _refresh(self, k: int, draws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Refresh the MTP cache over every pending position, draft k tokens (draws (R, k)), roll the drafts back."""
        assert self.mtp_cache is not None
        counts = self.log.counts
        ref_hidden, ref_tokens, ref_count = self.log.take(self.pad_id, width=k + 1)  # (R, W, H), (R, W), (R,)
        drafts, draft_probs = _draft(self.steps, self.model, self.mtp_cache, ref_hidden, ref_tokens, ref_count, k,
                                     self.mode, self.sampling, draws, list(self.live))  # (R, k), (R, k, V)
        self._head_refreshed(counts)
        return drafts, draft_probs

    def _head_refreshed(self, counts: list[int], current: bool = False) -> None:
        """The head's cache rolled back past the drafts: each row keeps the `counts` positions its refresh wrote.
        `current`: the head's drafting chain dropped its drafts itself (spec_step.draft_chain); another drafter may
        not have."""
        assert self.mtp_cache is not None
        self.mtp_len = [n + c for n, c in zip(self.mtp_len, counts)]
        self.mtp_cache.rollback(self.mtp_len, span=max(self.mtp_len), current=current)

    def _head_step(self, k: int, pending, drafting, draws: torch.Tensor):
        """A step whose drafts are the head's: the refresh, the drafting chain and the verify as one call of the
        steps' spec_step (one graph when compiled). draws (R, 2k + 2) -> hidden (R, Wc, H), results (R, 3(k+1) + 2)."""
        assert self.mtp_cache is not None
        counts = self.log.counts
        ref_hidden, ref_tokens, ref_count = self.log.take(self.pad_id, width=k + 1)  # (R, W, H), (R, W), (R,)
        is_draft, ids, chunk_counts = self._chunk(k, pending, drafting)
        out = self.steps.spec_step(self.model, self.cache, self.mtp_cache, ref_hidden, ref_tokens, ref_count, ids,
                                   chunk_counts, is_draft, draws, k=k, mode=self.mode, sampling=self.sampling)
        self._head_refreshed(counts, current=True)
        return out

    def _chunk(self, k: int, pending, drafting) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The verify's input: is_draft (R,), ids (R, Wc) (a drafting row's k draft slots padded, filled in the
        verify), counts (R,)."""
        ids, counts = pad_chunk([p + [self.pad_id] * k if d else p for p, d in zip(pending, drafting)],
                                self.pad_id, self.device)  # (R, Wc), (R,)
        return host_tensor(drafting, self.device, torch.bool), ids, counts

    def _verify(self, k: int, pending, drafting, drafts, draft_probs, draws):
        """One trunk forward and the acceptance (spec_step.verify): drafting rows feed [x_last, y_1..y_k], the
        others their pending tokens. -> hidden (R, Wc, H), the step's per-row results (R, 3(k+1) + 2)."""
        device = self.device
        batch = len(pending)
        is_draft, ids, counts = self._chunk(k, pending, drafting)
        if not k:
            vocab = self.model.config.vocab_size
            drafts, draft_probs = ids.new_zeros(batch, 0), torch.zeros(batch, 0, vocab, device=device)
        return self.steps.verify(self.model, self.cache, ids, counts, is_draft, drafts, draft_probs, draws, k=k,
                                 mode=self.mode, sampling=self.sampling)

    def _emit(self, k: int, pending, drafting, host, hidden) -> bool:
        """Hand each row its accepted run; log the positions now valid for the next MTP refresh. -> whether every row
        kept its whole run (else a stop, the row's budget or an interrupt cut one inside it)."""
        whole_runs = True
        counts: list[int] = []
        next_tokens: list[list[int]] = []
        for i, row in enumerate(self.live):
            if not pending[i]:  # finished before this step, riding along until the batch compacts
                counts.append(0)
                next_tokens.append([])
                continue
            n_acc = int(host[i][-1])
            toks = [int(t) for t in host[i][: n_acc + 1]]
            ents = host[i][2 * (k + 1): 2 * (k + 1) + n_acc + 1]
            kept = self.book.emit(row, toks, host[i][k + 1: k + 2 + n_acc], ents)
            whole_runs = whole_runs and kept == n_acc + 1
            if drafting[i]:  # ents[d - 1] is H(p_d)
                match, drafted = self.continuations[i] if self.continuations else (0, 0)
                source = "suffix" if match else "mtp"
                self.metrics.record_draft(n_acc, k, ents, sequence=row, source=source)
                count_draft(self.book.rows[row].drafts_by_source, source, n_acc)
                if self.chooser is not None:
                    self.chooser.observe(match, n_acc, drafted if match else k)
            self.metrics.record_emitted(ents[:kept])
            valid = pending[i] + toks[: kept - 1]  # tokens of this chunk now in the trunk cache
            self.trunk_len[i] += len(valid)
            done = self.book.rows[row].done
            counts.append(0 if done else len(valid))
            next_tokens.append([] if done else valid[1:] + [toks[kept - 1]])
        if self.mtp_cache is not None:
            self.log.add(hidden, counts, next_tokens)
        return whole_runs

    def _leave_finished(self) -> None:
        order = rows_to_keep(self.book, self.live)
        if order is None:
            return
        self.live = [self.live[i] for i in order]
        self.trunk_len = [self.trunk_len[i] for i in order]
        self.mtp_len = [self.mtp_len[i] for i in order]
        self.log.keep(order)
        if order:
            self.cache.compact(order, span=max(self.trunk_len))
            if self.mtp_cache is not None:
                self.mtp_cache.compact(order, span=max(self.mtp_len))
