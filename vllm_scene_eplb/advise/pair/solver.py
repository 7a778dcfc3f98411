"""The pair as a closed network (the package's docstring), solved exactly by the normalizing
constant in logs: its throughput at C clients, the clients' time that reproduces a measured one,
and an open load's throughput and what binds it. Pure numpy."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from .inputs import PairLoad


@dataclass(frozen=True)
class Network:
    """The pair as a closed network, in seconds and requests (the package's docstring)."""

    s_p: float
    p_engines: int
    handoff_s: float
    client_s: float
    tau: float
    decode_tokens: float
    d_engines: int
    d_max: int
    b_ref: float
    elasticity: float = 0.0

    def scaled(self, r_p: float = 1.0, r_d: float = 1.0) -> Network:
        """The network with P's service and D's time per token divided by their ratios."""
        return replace(self, s_p=self.s_p / r_p, tau=self.tau / r_d)

    def p_rates(self, n: int) -> np.ndarray:
        """mu_P(j) for j = 1..n [n], requests/s."""
        return np.minimum(np.arange(1, n + 1), self.p_engines) / self.s_p

    def d_rates(self, n: int) -> np.ndarray:
        """mu_D(j) for j = 1..n [n], requests/s."""
        b = np.minimum(np.arange(1, n + 1), self.d_engines * self.d_max) / self.d_engines
        return self.d_engines * b / (self.decode_tokens * self.step_s(b))

    def step_s(self, b):
        """tau(b): D's seconds per step at ``b`` sequences per engine (array or float)."""
        return self.tau * np.maximum(1e-9, 1 + self.elasticity * (b / self.b_ref - 1))

    @property
    def capacity_p(self) -> float:
        return self.p_engines / self.s_p

    @property
    def capacity_d(self) -> float:
        return float(self.d_rates(self.d_engines * self.d_max)[-1])


def _log_f(rates: np.ndarray) -> np.ndarray:
    """A load-dependent station's log f(j) = -sum_{i<=j} log mu(i), j = 0..n [n+1]."""
    return np.concatenate([[0.0], -np.cumsum(np.log(rates))])


def _log_delay(demand: float, n: int) -> np.ndarray:
    """A delay station's log f(j) = log(demand^j / j!), j = 0..n [n+1]."""
    j = np.arange(n + 1)
    if demand <= 0:
        return np.where(j == 0, 0.0, -np.inf)
    return j * math.log(demand) - np.array([math.lgamma(k + 1) for k in j])


def _log_sum(v: np.ndarray) -> float:
    top = float(np.max(v))
    return top if top == -math.inf else top + math.log(float(np.exp(v - top).sum()))


def _log_conv(a: np.ndarray, b: np.ndarray, rows: int = 256) -> np.ndarray:
    """log of the convolution of exp(a) and exp(b), both [n+1]: the normalizing constant of two
    stations, out[k] = log sum_i exp(a[i] + b[k - i]), ``rows`` values of k at a time."""
    n = len(a)
    out = np.empty(n)
    i = np.arange(n)
    for start in range(0, n, rows):
        k = np.arange(start, min(n, start + rows))[:, None]
        terms = np.where(i <= k, a[i] + b[np.clip(k - i, 0, None)], -np.inf)
        top = terms.max(axis=1)
        safe = np.where(np.isfinite(top), top, 0.0)
        with np.errstate(divide="ignore"):
            out[k[:, 0]] = safe + np.log(np.exp(terms - safe[:, None]).sum(axis=1))
    return out


@dataclass(frozen=True)
class Solution:
    """The network at C clients: throughput ``x`` (requests/s), P's utilization per engine, D's mean
    batch per engine and each station's mean residence (s) per visit."""

    x: float
    p_utilization: float
    d_batch: float
    residence_s: dict


def _throughput(g_pd: np.ndarray, delay: float, c: int) -> float:
    """X(C) = G(C-1) / G(C) from P and D's joint constant [C+1] and the delays' total demand."""
    d = _log_delay(delay, c)
    log_c = _log_sum(g_pd + d[::-1])
    log_c1 = _log_sum(g_pd[:c] + d[c - 1 :: -1])
    return math.exp(log_c1 - log_c)


def throughput(net: Network, c: int) -> float:
    """The closed loop's throughput at ``c`` clients, requests/s."""
    return _throughput(_log_conv(_log_f(net.p_rates(c)), _log_f(net.d_rates(c))), net.handoff_s + net.client_s, c)


def solve(net: Network, c: int) -> Solution:
    """Throughput, P's utilization, D's batch and the residences at ``c`` clients."""
    fp, fd, fz = _log_f(net.p_rates(c)), _log_f(net.d_rates(c)), _log_delay(net.handoff_s + net.client_s, c)
    g = _log_sum(_log_conv(fp, fd) + fz[::-1])
    x = throughput(net, c)
    j = np.arange(c + 1)
    p_at_p = np.exp(fp + _log_conv(fd, fz)[::-1] - g)  # P(j requests at P), j = 0..C
    p_at_d = np.exp(fd + _log_conv(fp, fz)[::-1] - g)
    n_p, n_d = float((j * p_at_p).sum()), float((j * p_at_d).sum())
    batch = float((np.minimum(j, net.d_engines * net.d_max) * p_at_d).sum()) / net.d_engines
    return Solution(
        x,
        x * net.s_p / net.p_engines,
        batch,
        {"prefill": n_p / x, "handoff": net.handoff_s, "decode": n_d / x, "clients": net.client_s},
    )


def calibrate(net: Network, c: int, measured: float) -> tuple[Network, float]:
    """The network with the clients' time that reproduces ``measured`` throughput at ``c`` clients
    (bisection: X falls with the delay), and the model's throughput with no client time over the
    measured one (below 1: the windows explain less throughput than was measured; the time is 0)."""
    g_pd = _log_conv(_log_f(net.p_rates(c)), _log_f(net.d_rates(c)))
    top = _throughput(g_pd, net.handoff_s, c)
    if top <= measured:
        return replace(net, client_s=0.0), top / measured
    lo, hi = 0.0, c / measured
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _throughput(g_pd, net.handoff_s + mid, c) > measured else (lo, mid)
    return replace(net, client_s=(lo + hi) / 2), top / measured


def open_throughput(net: Network, rate: float, cap: int | None) -> tuple[float, str]:
    """An open load's throughput and what binds it: the rate, P's or D's capacity, or the
    concurrency cap's closed loop (no client time)."""
    bounds = {"offered_load": rate, "prefill": net.capacity_p, "decode": net.capacity_d}
    if cap is not None:
        bounds["clients"] = throughput(replace(net, client_s=0.0), cap)
    side = min(bounds, key=lambda k: bounds[k])
    return bounds[side], side


def load_throughput(net: Network, load: PairLoad) -> float:
    """The load's throughput under ``net``: the closed loop's at its clients, or the open one's."""
    return throughput(net, load.clients) if load.closed else open_throughput(net, load.rate, load.concurrency)[0]
