"""Progress of long phases on the console: `progress(iterable, total, desc)`.

A phase that ends within `delay` seconds prints nothing. One that runs longer prints a
line when it has run `delay` seconds, then every `every_seconds` or every `every_fraction`
of `total`, whichever comes first, and a closing line:

  evaluating validation: 40/120 (33%) | 12.5/s | ETA 0:06
  evaluating validation: done, 120 in 9.6s

Without a `total` the lines give the count and the rate. `format_duration` is the clock
format of these lines and of the training console's ETA (`M:SS`, `H:MM:SS` past an hour).
Only process 0 should print: callers pass `enabled=False` elsewhere.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def format_duration(seconds: float) -> str:
  """Seconds as `M:SS`, or `H:MM:SS` from one hour on (`2:21`, `1:02:03`)."""
  if not math.isfinite(seconds) or seconds < 0:
    raise ValueError(f"seconds must be finite and >= 0; got {seconds!r}")
  total = round(seconds)
  hours, rest = divmod(total, 3600)
  minutes, secs = divmod(rest, 60)
  return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def progress(
  iterable: Iterable[T],
  total: int | None = None,
  desc: str = "",
  *,
  delay: float = 5.0,
  every_seconds: float = 10.0,
  every_fraction: float = 0.1,
  enabled: bool = True,
  print_fn: Callable[[str], Any] = print,
  clock: Callable[[], float] = time.monotonic,
) -> Iterator[T]:
  """Yields the items of `iterable`, printing progress lines while it runs long.

  total: the number of items expected (None: unknown, no percentage or ETA).
  desc: what the phase is ('evaluating validation'), the start of every line.
  delay: seconds before the first line (a shorter phase prints nothing).
  every_seconds, every_fraction: the next line comes after this many seconds or this
    share of `total` more items, whichever is first.
  """
  if total is not None and total < 0:
    raise ValueError(f"total must be >= 0 or None; got {total!r}")
  if every_seconds <= 0 or not 0 < every_fraction <= 1 or delay < 0:
    raise ValueError("delay must be >= 0, every_seconds > 0 and every_fraction in (0, 1]")
  start = clock()
  last_time, last_count, printed, count = start, 0, False, 0
  step = max(1, math.ceil(every_fraction * total)) if total else None
  for item in iterable:
    yield item
    count += 1
    if not enabled:
      continue
    now = clock()
    if now - start < delay:
      continue
    due = not printed or now - last_time >= every_seconds
    due = due or (step is not None and count - last_count >= step)
    if due and not (total is not None and count >= total):  # the closing line says that
      print_fn(progress_line(desc, count, total, now - start))
      last_time, last_count, printed = now, count, True
  if enabled and printed:
    print_fn(f"{desc}: done, {count} in {clock() - start:.1f}s")


def progress_line(desc: str, count: int, total: int | None, elapsed: float) -> str:
  """`desc: 40/120 (33%) | 12.5/s | ETA 0:06` (no total: `desc: 40 | 12.5/s`)."""
  rate = count / elapsed if elapsed > 0 else 0.0
  shown = f"{count}/{total} ({100 * count / total:.0f}%)" if total else f"{count}"
  line = f"{desc}: {shown} | {rate:.3g}/s"
  if total and rate > 0:
    line += f" | ETA {format_duration(max(total - count, 0) / rate)}"
  return line


class Timed:
  """`with Timed('training SentencePiece (vocab 8000)'):` prints the phase's start and,
  at its end, how long it took (for a phase with no steps to count)."""

  def __init__(
    self,
    desc: str,
    enabled: bool = True,
    print_fn: Callable[[str], Any] = print,
    clock: Callable[[], float] = time.monotonic,
  ):
    self.desc, self.enabled, self._print, self._clock = desc, enabled, print_fn, clock

  def __enter__(self) -> Timed:
    self._start = self._clock()
    if self.enabled:
      self._print(f"{self.desc} ...")
    return self

  def __exit__(self, *exc: Any) -> None:
    if self.enabled and exc[0] is None:
      self._print(f"{self.desc}: done in {format_duration(self._clock() - self._start)}")
