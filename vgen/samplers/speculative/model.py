"""A draft model as a draft source (:class:`~vgen.samplers.speculative.scheduler.DraftSource`): a second
autoregressive model over the target's tokens proposes a chain of ``window - 1`` tokens per pass, each drawn from its
own distribution (guided, filtered and temperature-scaled exactly as the target's) with the sample's own uniforms,
and the target verifies them in one pass (speculative sampling; ``sampler=sps`` composes it with a rule).

The draft keeps its own static cache, which, like the target's, needs no rollback. After a pass that accepted k of
the drafts it fed, its cache already holds every decided token before n + k (the accepted drafts are the ones it fed,
on the same prefix), except the last draft, which a chain never feeds. So the catch-up feeds two tokens per sample,
at n + k - 1 and n + k (the first rewritten unchanged when it was fed), and its second row predicts the next draft;
then the chain: draw, feed, draw. A pass runs the draft model ``window - 1`` times, on 2 then 1 tokens per sample.
Rows that are finished (or, after a prefill, not refilled) write to a junk slot no query reads.
"""
from __future__ import annotations

import torch

from vgen.samplers.speculative.head import draft_chain
from vgen.samplers.speculative.step import Chain, SlotState, StepConfig, Verdict, speculative_step


def both(x: torch.Tensor, cfg: bool) -> torch.Tensor:
    """Rows [cond; uncond] under classifier-free guidance: the same tokens or positions twice."""
    return torch.cat([x, x]) if cfg else x


class AsHead:
    """A draft model where the draft head's chain (:func:`~vgen.samplers.speculative.head.draft_chain`) takes a
    head: its state is its logits, and a step feeds the drawn token through the model's static cache."""

    def __init__(self, dmodel):
        self.dmodel = dmodel

    @staticmethod
    def logits(model, g: torch.Tensor) -> torch.Tensor:
        return g

    def __call__(self, model, g, x, pos, dcache) -> torch.Tensor:
        return self.dmodel.decode(x, pos, dcache)


def model_step(model, cache, s: SlotState, wv, it, W: int, c: StepConfig, rule, **args) -> None:
    """One pass of a draft model's chain (:func:`~vgen.samplers.speculative.step.speculative_step` with
    :class:`ModelChain`'s hooks)."""
    speculative_step(ModelChain, model, cache, s, wv, it, W, c, rule, **args)


class ModelChain(Chain):
    """A draft model's chain: after each target pass the draft catches up on the decided tokens (two per sample)
    and drafts ``window - 1`` tokens, each from its own distribution. ``step_args``: the draft model as a head
    (:class:`AsHead`) and its cache."""
    step_fn = staticmethod(model_step)

    @staticmethod
    def draft(model, cache, tokens, s: SlotState, v: Verdict, wv, p, h, us, W: int, c: StepConfig, *, drafter,
              dcache, **args):
        n, k, L, D = s.n, v.k, c.L, c.D
        t = (n + k - 1)[:, None] + torch.arange(2, device=n.device)  # the last accepted (or decided) token, the drawn
        live = n < L
        pos = torch.where(live[:, None] & (t < L), model.cond_len + t, model.cond_len + L - 1)
        dcache.limit(cache.length + W + D)  # its queries this pass sit at most W + D slots past the target's
        logits = drafter.dmodel.decode(both(tokens.gather(1, t), c.cfg), both(pos, c.cfg), dcache)[:, 1:]
        nxt = n + k + 1
        f, qwin = draft_chain(model, drafter, dcache, logits, nxt, us[3], L, c.cfg, live, c.sampling)
        return tokens.scatter(1, nxt[:, None] + torch.arange(D, device=n.device), f), qwin

    def __init__(self, model, config: StepConfig, dmodel, slots: int):
        self.config, self.dmodel = config, dmodel
        self.step_args = {"drafter": AsHead(dmodel), "dcache": dmodel.new_cache(2 * slots if config.cfg else slots)}

    def prefill(self, model, cond_in, cache):
        """The condition through both models (the draft with its own unconditional rows)."""
        dcache, c = self.step_args["dcache"], self.config
        cond = cond_in[: cond_in.shape[0] // 2] if c.cfg else cond_in
        dcache.limit(None)
        self.dmodel.prefill(torch.cat([cond, self.dmodel.null_cond(cond)]) if c.cfg else cond, dcache)
        return model.prefill(cond_in, cache)[:, None], None

    def feed(self, model, x, pos, cache):
        self.dmodel.decode(x, pos, self.step_args["dcache"])
        return model.decode(x, pos, cache), None

    def first_drafts(self, model, tokens, first, p0, uf, feats, refilled):
        """The draft reads the first drawn token of the refilled rows (the other rows write to the junk slot), then
        drafts after it."""
        L, P, c = model.seq_len, int(first[0]), self.config
        dmodel, dcache = self.dmodel, self.step_args["dcache"]
        pos = torch.where(refilled, model.cond_len + P, model.cond_len + L - 1)[:, None]
        dcache.limit(None)
        logits = dmodel.decode(both(tokens[:, P:P + 1], c.cfg), both(pos, c.cfg), dcache)
        return draft_chain(model, self.step_args["drafter"], dcache, logits, first + 1, uf, L, c.cfg, refilled,
                           c.sampling)
