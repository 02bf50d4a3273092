#!/usr/bin/env python3
"""Runs one hfl experiment with each DC's process in its own network namespace (root, Linux).

  sudo python launch/emulated_wan.py --wan_mbps=100 --wan_latency_ms=20 -- \\
      --config=configs/smoke.py --workdir=/tmp/hfl_wan

One process per DC (``mesh.num_dcs`` processes, ``workers_per_dc`` CPU devices
each). DC i runs in namespace ``hflwan-dc<i>`` with address 10.77.<i>.1/24 on a
veth whose peer (10.77.<i>.254) sits in a router namespace ``hflwan-hub``; every
inter-DC packet is routed through the hub. Both ends of every DC's link are
shaped, so each DC has a full-duplex WAN link (as in hfl/network.py): the DC-side
veth's egress (uploads) and the hub-side veth's egress (downloads) are limited to
the rate with ``tc``. The one-way delay D is added

* by ``netem`` (``rate R delay D/2`` on both ends) when the kernel has it;
* otherwise by a delay line: the hub routes every packet arriving from a DC
  (policy routing on the input interface) into a TUN device, a small process
  holds each packet D seconds and writes it back, and the hub forwards it to its
  destination DC (rate shaping is then ``tbf``). The delay line is FIFO, so
  packets are never reordered; its timer slack (≲ 1 ms, it runs at raised
  priority) is small against a 10 ms-scale WAN delay.

The inter-DC collectives (gloo over TCP between the processes) therefore really
cross a link of the configured rate and delay; collectives among the workers of
one DC stay inside its namespace. TCP's slow-start restart after idle is turned
off in the DC namespaces (``net.ipv4.tcp_slow_start_after_idle=0``), as
long-haul deployments do, so a connection idle between two inter-DC rounds keeps
its window.

Only this machine's own namespaces and the private 10.77.0.0/16 addresses are
touched; everything is removed on exit (also on Ctrl-C). Gloo binds to the
address the host name resolves to, so each namespace gets
``/etc/netns/<ns>/hosts`` mapping this host's name to its DC address (``ip netns
exec`` mounts it over /etc/hosts).

Paths are the caller's: ``main.py`` runs in the caller's working directory (in
each namespace), so a relative ``--workdir`` or ``--config`` means what it means
to the caller. Before anything is created, bad input is refused in one line
(exit status 2): no ``--workdir`` or config file, a non-finite or out-of-range
rate, latency or timeout, fewer than 2 DCs, not root, a missing ``ip``/``tc``,
or another emulated_wan.py run in progress (the namespace names are fixed; a
lock serialises runs). Each process is told (``HFL_ONE_DC_PER_PROCESS=1``) to
refuse a mesh that does not put exactly one DC in each process.

While the run lasts, the launcher watches its helpers as well as the training
processes: if the delay line exits, or a shaping qdisc disappears (checked
every 5 s), the run is stopped and fails with a message naming it, since the
traffic would no longer cross the emulated WAN as configured.

Writes WORKDIR/wan_info.json (rate, delay, qdisc and delay method used; strict
JSON, hfl.metrics.write_json) and per-DC logs in WORKDIR/logs (and
``delay_line.log``). Exit status: 0 if every process succeeds; else the first
failing process's status, 1 when a helper failed, 124 on --timeout_s, 2 for bad
input.
"""

import argparse
import collections
import fcntl
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # launch/common.py (puts the repository on sys.path)  # pylint: disable=g-bad-import-order,wrong-import-position
from hfl import distributed  # pylint: disable=g-import-not-at-top,wrong-import-order
from hfl import metrics  # pylint: disable=g-import-not-at-top,wrong-import-order

HUB = 'hflwan-hub'
TUN = 'hfldelay'
TABLE = '77'
PORT = 12355  # the coordinator's, inside DC 0's fresh namespace (always free there)
# Held for the whole run: the namespace names are fixed, so one run at a time.
LOCK = '/run/hflwan.lock' if os.path.isdir('/run') else '/tmp/hflwan.lock'


def dc_addr(i: int) -> str:
  return f'10.77.{i}.1'


def sh(*cmd, check=True):
  r = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if check and r.returncode:
    raise RuntimeError(f'{" ".join(cmd)}: {r.stderr.strip()}')
  return r


# The fastest emulated WAN, Mbit/s per DC (1 Tbit/s).
MAX_WAN_MBPS = 1e6


def shape(ns: str, dev: str, rate_mbit: float, delay_ms: float) -> str:
  """Shapes ``dev``'s egress in ``ns`` (netem with ``delay_ms`` if it can); returns the qdisc."""
  r = sh('ip', 'netns', 'exec', ns, 'tc', 'qdisc', 'replace', 'dev', dev, 'root', 'netem',
         'rate', f'{rate_mbit}mbit', 'delay', f'{delay_ms}ms', 'limit', '100000', check=False)
  if r.returncode == 0:
    return 'netem'
  # No netem in this kernel: token bucket, bandwidth only. Burst ~ 1 ms at rate.
  burst = max(int(rate_mbit * 1e6 / 8 / 1000), 16000)
  sh('ip', 'netns', 'exec', ns, 'tc', 'qdisc', 'replace', 'dev', dev, 'root', 'tbf', 'rate',
     f'{rate_mbit}mbit', 'burst', str(burst), 'latency', '2s')
  return 'tbf'


def has_netem() -> bool:
  """Whether this kernel has the netem qdisc (tried on a scratch namespace's lo)."""
  ns = 'hflwan-probe'
  sh('ip', 'netns', 'add', ns, check=False)
  try:
    r = sh('ip', 'netns', 'exec', ns, 'tc', 'qdisc', 'add', 'dev', 'lo', 'root', 'netem',
           'delay', '1ms', check=False)
    return r.returncode == 0
  finally:
    sh('ip', 'netns', 'del', ns, check=False)


def delay_line(name: str, delay_s: float) -> None:
  """Holds every packet read from TUN device ``name`` for ``delay_s``, then writes it back.

  Runs until killed; prints ``ready`` once the device exists. FIFO: a constant
  delay keeps the packet order.
  """
  tunsetiff, iff_tun, iff_no_pi = 0x400454ca, 0x0001, 0x1000
  fd = os.open('/dev/net/tun', os.O_RDWR)
  fcntl.ioctl(fd, tunsetiff, struct.pack('16sH', name.encode(), iff_tun | iff_no_pi))
  os.set_blocking(fd, False)
  try:
    os.nice(-15)  # root: keep the timer tight while the training saturates the cores
  except OSError:
    pass
  print('ready', flush=True)
  held = collections.deque()
  while True:
    now = time.monotonic()
    while held and held[0][0] <= now:
      os.write(fd, held.popleft()[1])
    timeout = held[0][0] - now if held else 1.0
    ready, _, _ = select.select([fd], [], [], max(timeout, 0.0))
    if ready:
      t = time.monotonic() + delay_s
      while True:
        try:
          held.append((t, os.read(fd, 65536)))
        except BlockingIOError:
          break


def setup(num_dcs: int, rate_mbit: float, delay_ms: float, logs: str,
          helpers: dict) -> tuple[dict, list]:
  """Builds the namespaces and links (root; :func:`check` has run).

  Args:
    num_dcs: DCs (namespaces).
    rate_mbit: per-DC link rate, Mbit/s (finite, > 0).
    delay_ms: one-way delay, ms (finite, >= 0).
    logs: directory for the delay line's log.
    helpers: the delay line, when one is needed, is added here as
      ``{'the delay line': (Popen, log path)}`` as soon as it starts (so the
      caller stops it whatever happens next).

  Returns:
    (WAN_INFO for wan_info.json, [(namespace, device, qdisc kind)] shaped).

  Raises:
    RuntimeError: a command failed, or no way to add the delay exists.
  """
  teardown(num_dcs)
  netem = has_netem()
  use_line = delay_ms > 0 and not netem
  if use_line and not os.path.exists('/dev/net/tun'):
    raise RuntimeError('this kernel has no netem and there is no /dev/net/tun: cannot add '
                       'WAN delay (run with --wan_latency_ms=0 for a rate-only link).')
  sh('ip', 'netns', 'add', HUB)
  sh('ip', '-n', HUB, 'link', 'set', 'lo', 'up')
  for key in ('net.ipv4.ip_forward=1', 'net.ipv4.conf.all.rp_filter=0',
              'net.ipv4.conf.default.rp_filter=0'):
    sh('ip', 'netns', 'exec', HUB, 'sysctl', '-qw', key)
  host = socket.gethostname()
  shaped = []
  for i in range(num_dcs):
    ns = f'hflwan-dc{i}'
    sh('ip', 'netns', 'add', ns)
    sh('ip', 'netns', 'exec', ns, 'sysctl', '-qw', 'net.ipv4.tcp_slow_start_after_idle=0')
    sh('ip', 'link', 'add', f'hflw{i}', 'type', 'veth', 'peer', 'name', f'hflh{i}')
    sh('ip', 'link', 'set', f'hflw{i}', 'netns', ns)
    sh('ip', 'link', 'set', f'hflh{i}', 'netns', HUB)
    sh('ip', '-n', ns, 'addr', 'add', f'{dc_addr(i)}/24', 'dev', f'hflw{i}')
    sh('ip', '-n', HUB, 'addr', 'add', f'10.77.{i}.254/24', 'dev', f'hflh{i}')
    for n, dev in ((ns, f'hflw{i}'), (ns, 'lo'), (HUB, f'hflh{i}')):
      sh('ip', '-n', n, 'link', 'set', dev, 'up')
    sh('ip', '-n', ns, 'route', 'add', 'default', 'via', f'10.77.{i}.254')
    # Full duplex: uploads shaped in the DC, downloads on the hub side.
    half = 0.0 if use_line else delay_ms / 2
    for n, dev in ((ns, f'hflw{i}'), (HUB, f'hflh{i}')):
      shaped.append((n, dev, shape(n, dev, rate_mbit, half)))
    os.makedirs(f'/etc/netns/{ns}', exist_ok=True)
    with open(f'/etc/netns/{ns}/hosts', 'w') as f:
      f.write(f'127.0.0.1 localhost\n{dc_addr(i)} {host}\n')
  if use_line:
    path = os.path.join(logs, 'delay_line.log')
    with open(path, 'a') as err:
      start = err.tell()
      line = subprocess.Popen(  # pylint: disable=consider-using-with
          ['ip', 'netns', 'exec', HUB, sys.executable, os.path.abspath(__file__),
           f'--_delay_line={delay_ms / 1000}'], stdout=subprocess.PIPE, stderr=err,
          text=True, start_new_session=True)
    helpers['the delay line'] = (line, path, start)
    if line.stdout.readline().strip() != 'ready':
      raise RuntimeError('the delay line did not start: '
                         f'{common.tail(path, 3, start=start).strip()}')
    sh('ip', '-n', HUB, 'link', 'set', TUN, 'up')
    sh('ip', 'netns', 'exec', HUB, 'sysctl', '-qw', f'net.ipv4.conf.{TUN}.rp_filter=0')
    sh('ip', '-n', HUB, 'route', 'add', 'default', 'dev', TUN, 'table', TABLE)
    for i in range(num_dcs):  # from a DC: into the delay line; from it: main table
      sh('ip', '-n', HUB, 'rule', 'add', 'iif', f'hflh{i}', 'lookup', TABLE, 'pref', '100')
  method = 'netem' if netem else ('delay line (TUN)' if use_line else 'none')
  return dict(rate_mbit=rate_mbit, delay_ms_requested=delay_ms,
              one_way_delay_ms=delay_ms if (netem or use_line) else 0.0,
              qdisc=sorted({k for _, _, k in shaped}), delay_method=method), shaped


def teardown(num_dcs: int) -> None:
  for i in range(max(num_dcs, 16)):
    ns = f'hflwan-dc{i}'
    sh('ip', 'netns', 'del', ns, check=False)
    shutil.rmtree(f'/etc/netns/{ns}', ignore_errors=True)
  sh('ip', 'netns', 'del', HUB, check=False)


def check(args, margs):
  """Everything that can be checked before anything is created: (workdir, num_dcs, rate, delay).

  Raises:
    common.LaunchError: no --workdir/--config, a config that cannot be read, a
      non-finite or out-of-range rate, latency or timeout, fewer than 2 DCs, not
      root, or ip/tc missing.
  """
  workdir = common.workdir(margs)
  common.config_path(margs)
  num_dcs = common.config_value(margs, 'mesh.num_dcs', 2)
  if args.wan_mbps is not None:
    rate = common.finite(args.wan_mbps, '--wan_mbps', 0.0, allow_equal=False)
  else:
    rate = common.finite(common.config_value(margs, 'network.wan_bandwidth_mbps', 100.0),
                         'network.wan_bandwidth_mbps', 0.0, allow_equal=False)
  if rate > MAX_WAN_MBPS:
    where = '--wan_mbps' if args.wan_mbps is not None else 'network.wan_bandwidth_mbps'
    raise common.LaunchError(
        f'{where}={rate:g} Mbit/s exceeds {MAX_WAN_MBPS:g} (1 Tbit/s): tc cannot shape '
        'faster (its token bucket of about 1 ms at the rate outgrows 32 bits near '
        '34 Tbit/s); give a rate in (0, 1e6].')
  if args.wan_latency_ms is not None:
    delay = common.finite(args.wan_latency_ms, '--wan_latency_ms')
  else:
    delay = 1000 * common.finite(common.config_value(margs, 'network.wan_latency_s', 0.02),
                                 'network.wan_latency_s')
  common.finite(args.timeout_s, '--timeout_s', 0.0, allow_equal=False)
  if args.init_timeout_s < 1:
    raise common.LaunchError(f'--init_timeout_s={args.init_timeout_s} must be >= 1.')
  if num_dcs < 2:
    raise common.LaunchError(f'mesh.num_dcs={num_dcs}: the emulated WAN needs >= 2 DCs.')
  if os.geteuid() != 0:
    raise common.LaunchError('emulated_wan.py needs root (it creates network namespaces and '
                             'tc qdiscs); run it with sudo.')
  for tool in ('ip', 'tc'):
    if shutil.which(tool) is None:
      raise common.LaunchError(f'{tool} not found (install iproute2).')
  return workdir, num_dcs, rate, delay


def take_lock():
  """An exclusive lock on the namespaces' names, held until the process exits.

  Raises:
    common.LaunchError: another emulated_wan.py run holds it.
  """
  f = open(LOCK, 'a+')  # pylint: disable=consider-using-with
  try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    f.seek(0)
    raise common.LaunchError(f'another emulated_wan.py run (pid {f.read().strip() or "?"}) '
                             f'is using the hflwan-* namespaces (lock {LOCK}); wait for it '
                             'to finish.') from None
  f.truncate(0)
  f.write(str(os.getpid()))
  f.flush()
  return f


def shaper_alive(shaped) -> str | None:
  """None when every (namespace, device, qdisc) of ``shaped`` is still installed, else which is not."""
  for ns, dev, kind in shaped:
    r = sh('ip', 'netns', 'exec', ns, 'tc', 'qdisc', 'show', 'dev', dev, check=False)
    if r.returncode or f'qdisc {kind} ' not in r.stdout:
      return f'the rate shaper ({kind} on {dev} in namespace {ns}) is gone'
  return None


def first_failure(procs, helpers):
  """The first failed process, as (exit status, message), or None; also (0, '') when all ended OK.

  Args:
    procs: {DC index: (Popen, log path, byte offset where this run's output begins)} of
      the training processes (logs are appended to; a tail shows this run's part only).
    helpers: {name: (Popen, log path, offset)} of processes that must outlive the run
      (the delay line): any exit of theirs while training runs is a failure.
  """
  for name, (q, log, start) in helpers.items():
    if q.poll() is not None:
      return 1, (f'{name} (pid {q.pid}) exited with status {q.returncode} mid-run, so '
                 f'inter-DC traffic no longer crosses the emulated WAN; the run is stopped. '
                 f'Tail of this run\'s output in {log}:\n{common.tail(log, start=start)}')
  codes = {i: q.poll() for i, (q, _, _) in procs.items()}
  for i, c in codes.items():
    if c not in (None, 0):
      _, log, start = procs[i]
      return (c if c > 0 else 1), (f'process {i} (DC {i}) failed with status {c}; tail of '
                                   f'this run\'s output in {log}:\n'
                                   f'{common.tail(log, start=start)}')
  if all(c == 0 for c in codes.values()):
    return 0, ''
  return None


def watch(procs, helpers, shaped, timeout_s: float):
  """Waits for the run; returns (exit status, message). Checks the shaper every 5 s."""
  t0 = last_check = time.monotonic()
  while True:
    result = first_failure(procs, helpers)
    if result is not None:
      return result
    now = time.monotonic()
    if now - last_check > 5:
      last_check = now
      gone = shaper_alive(shaped)
      if gone:
        return 1, f'{gone} mid-run, so the link is no longer rate-limited; the run is stopped.'
    if now - t0 > timeout_s:
      return 124, f'timed out after {timeout_s:g} s (--timeout_s); stopped all processes.'
    time.sleep(0.2)


def main() -> int:
  p = argparse.ArgumentParser(
      description=__doc__.split('\n\n')[0] + ' Usage: emulated_wan.py [options] -- '
      '<main.py flags, with --workdir=DIR>.',
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument('--wan_mbps', type=float, default=None,
                 help='per-DC WAN rate, Mbit/s (default: config network.wan_bandwidth_mbps)')
  p.add_argument('--wan_latency_ms', type=float, default=None,
                 help='one-way WAN latency, ms (default: config network.wan_latency_s)')
  p.add_argument('--init_timeout_s', type=int, default=60,
                 help='seconds the processes wait for each other at start-up')
  p.add_argument('--timeout_s', type=float, default=1800,
                 help='seconds before the whole run is stopped (exit 124)')
  p.add_argument('--keep', action='store_true', help='keep the namespaces after the run')
  p.add_argument('--_delay_line', type=float, default=None, help=argparse.SUPPRESS)
  p.add_argument('main_args', nargs=argparse.REMAINDER,
                 help='-- then the flags for main.py (--config=..., --workdir=DIR, ...)')
  args = p.parse_args()
  if args._delay_line is not None:  # pylint: disable=protected-access
    delay_line(TUN, args._delay_line)  # pylint: disable=protected-access
    return 0
  margs = args.main_args[1:] if args.main_args[:1] == ['--'] else args.main_args
  try:
    workdir, num_dcs, rate, delay = check(args, margs)
    lock = take_lock()  # pylint: disable=unused-variable
  except common.LaunchError as e:
    return common.fail('[wan]', e)
  logs = os.path.join(workdir, 'logs')
  procs, helpers = {}, {}
  # SIGTERM (e.g. from a job's timeout) ends the run through the cleanup below.
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
  try:
    try:
      os.makedirs(logs, exist_ok=True)
      info, shaped = setup(num_dcs, rate, delay, logs, helpers)
      if helpers:
        line = helpers['the delay line'][0]
        print(f'[wan] netem is not available in this kernel: links are rate-limited to '
              f'{rate} Mbit/s with tbf and delayed {delay} ms by a TUN delay line '
              f'(pid {line.pid}).', file=sys.stderr, flush=True)
      metrics.write_json(os.path.join(workdir, 'wan_info.json'), info)
    except (RuntimeError, OSError, ValueError) as e:
      return common.fail('[wan]', e)
    print(f'[wan] {num_dcs} DC namespaces, {info}', flush=True)
    t0 = time.monotonic()
    for i in range(num_dcs):
      env = dict(os.environ, HFL_COORDINATOR=f'{dc_addr(0)}:{PORT}',
                 HFL_NUM_PROCESSES=str(num_dcs), HFL_PROCESS_ID=str(i),
                 HFL_INIT_TIMEOUT_S=str(args.init_timeout_s), JAX_PLATFORMS='cpu',
                 PYTHONUNBUFFERED='1')
      env[distributed.ENV_ONE_DC_PER_PROCESS] = '1'
      path = os.path.join(logs, f'process_{i}.log')
      with open(path, 'a') as log:  # the child keeps its own descriptor; a rerun appends
        log.write(f'[wan] {time.strftime("%Y-%m-%d %H:%M:%S")}: process {i} of {num_dcs} '
                  'starts\n')
        log.flush()
        procs[i] = (subprocess.Popen(  # in the caller's directory: its relative paths hold
            ['ip', 'netns', 'exec', f'hflwan-dc{i}', sys.executable, common.MAIN] + margs,
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True), path,
                    log.tell())
    status, message = watch(procs, helpers, shaped, args.timeout_s)
    if message:
      print(f'[wan] error: {message}', file=sys.stderr, flush=True)
    print(f'[wan] finished with status {status} in {time.monotonic() - t0:.1f} s; logs in {logs}',
          flush=True)
    return status
  finally:
    for q, *_ in list(procs.values()) + list(helpers.values()):
      if q.poll() is None:
        os.killpg(q.pid, signal.SIGTERM)
        try:
          q.wait(5)
        except subprocess.TimeoutExpired:
          os.killpg(q.pid, signal.SIGKILL)
          q.wait()
    if not args.keep:
      teardown(num_dcs)


if __name__ == '__main__':
  sys.exit(main())
