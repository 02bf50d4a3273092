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

Writes WORKDIR/wan_info.json (rate, delay, qdisc and delay method used) and per-DC logs in
WORKDIR/logs. Exit status: 0 if every process succeeds, else the first failing one.
"""

import argparse
import collections
import fcntl
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HUB = 'hflwan-hub'
TUN = 'hfldelay'
TABLE = '77'


def dc_addr(i: int) -> str:
  return f'10.77.{i}.1'


def sh(*cmd, check=True):
  r = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if check and r.returncode:
    raise RuntimeError(f'{" ".join(cmd)}: {r.stderr.strip()}')
  return r


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


def setup(num_dcs: int, rate_mbit: float, delay_ms: float) -> tuple[dict, subprocess.Popen | None]:
  """Builds the namespaces and links; returns (WAN_INFO, the delay-line process or None)."""
  if os.geteuid() != 0:
    raise RuntimeError('emulated_wan.py needs root (ip netns, tc).')
  for tool in ('ip', 'tc'):
    if shutil.which(tool) is None:
      raise RuntimeError(f'{tool} not found (install iproute2).')
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
  qdiscs = set()
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
    qdiscs.add(shape(ns, f'hflw{i}', rate_mbit, half))
    qdiscs.add(shape(HUB, f'hflh{i}', rate_mbit, half))
    os.makedirs(f'/etc/netns/{ns}', exist_ok=True)
    with open(f'/etc/netns/{ns}/hosts', 'w') as f:
      f.write(f'127.0.0.1 localhost\n{dc_addr(i)} {host}\n')
  line = None
  if use_line:
    line = subprocess.Popen(  # pylint: disable=consider-using-with
        ['ip', 'netns', 'exec', HUB, sys.executable, os.path.abspath(__file__),
         f'--_delay_line={delay_ms / 1000}'], stdout=subprocess.PIPE, text=True,
        start_new_session=True)
    if line.stdout.readline().strip() != 'ready':
      raise RuntimeError('the delay line did not start (see its stderr above).')
    sh('ip', '-n', HUB, 'link', 'set', TUN, 'up')
    sh('ip', 'netns', 'exec', HUB, 'sysctl', '-qw', f'net.ipv4.conf.{TUN}.rp_filter=0')
    sh('ip', '-n', HUB, 'route', 'add', 'default', 'dev', TUN, 'table', TABLE)
    for i in range(num_dcs):  # from a DC: into the delay line; from it: main table
      sh('ip', '-n', HUB, 'rule', 'add', 'iif', f'hflh{i}', 'lookup', TABLE, 'pref', '100')
  method = 'netem' if netem else ('delay line (TUN)' if use_line else 'none')
  return dict(rate_mbit=rate_mbit, delay_ms_requested=delay_ms,
              one_way_delay_ms=delay_ms if (netem or use_line) else 0.0,
              qdisc=sorted(qdiscs), delay_method=method), line


def teardown(num_dcs: int) -> None:
  for i in range(max(num_dcs, 16)):
    ns = f'hflwan-dc{i}'
    sh('ip', 'netns', 'del', ns, check=False)
    shutil.rmtree(f'/etc/netns/{ns}', ignore_errors=True)
  sh('ip', 'netns', 'del', HUB, check=False)


def config_value(main_args, field: str, default):
  """Reads config ``field`` from ``--config.<field>=`` overrides, else the config file."""
  for a in main_args:
    if a.startswith(f'--config.{field}='):
      return type(default)(a.split('=', 1)[1])
  path = next((a.split('=', 1)[1] for a in main_args if a.startswith('--config=')), None)
  if path:
    sys.path.insert(0, REPO)
    import importlib.util  # pylint: disable=g-import-not-at-top
    spec = importlib.util.spec_from_file_location('cfg', os.path.join(REPO, path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    v = mod.get_config()
    for p in field.split('.'):
      v = v[p]
    return type(default)(v)
  return default


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
  workdir = next((a.split('=', 1)[1] for a in margs if a.startswith('--workdir=')), None)
  if not workdir:
    p.error('pass the run\'s workdir after --, as --workdir=DIR')
  try:
    num_dcs = config_value(margs, 'mesh.num_dcs', 2)
    rate = (args.wan_mbps if args.wan_mbps is not None
            else config_value(margs, 'network.wan_bandwidth_mbps', 100.0))
    delay = (args.wan_latency_ms if args.wan_latency_ms is not None
             else 1000 * config_value(margs, 'network.wan_latency_s', 0.02))
  except (OSError, KeyError, ValueError, TypeError, AttributeError) as e:
    p.error(f'could not read the config from {margs}: {type(e).__name__}: {e}')
  if not rate > 0 or not delay >= 0 or num_dcs < 2:
    p.error(f'need a WAN rate > 0 Mbit/s (got {rate}), a latency >= 0 ms (got {delay}) and '
            f'mesh.num_dcs >= 2 (got {num_dcs})')
  logs = os.path.join(workdir, 'logs')
  os.makedirs(logs, exist_ok=True)
  procs, line = [], None
  try:
    info, line = setup(num_dcs, rate, delay)
    if info['delay_method'] == 'delay line (TUN)':
      print(f'[wan] netem is not available in this kernel: links are rate-limited to '
            f'{rate} Mbit/s with tbf and delayed {delay} ms by a TUN delay line.',
            file=sys.stderr)
    with open(os.path.join(workdir, 'wan_info.json'), 'w') as f:
      json.dump(info, f, indent=2)
    print(f'[wan] {num_dcs} DC namespaces, {info}', flush=True)
    port = 12355
    t0 = time.monotonic()
    for i in range(num_dcs):
      env = dict(os.environ, HFL_COORDINATOR=f'{dc_addr(0)}:{port}',
                 HFL_NUM_PROCESSES=str(num_dcs), HFL_PROCESS_ID=str(i),
                 HFL_INIT_TIMEOUT_S=str(args.init_timeout_s), JAX_PLATFORMS='cpu',
                 PYTHONUNBUFFERED='1')
      log = open(os.path.join(logs, f'process_{i}.log'), 'w')  # pylint: disable=consider-using-with
      procs.append(subprocess.Popen(
          ['ip', 'netns', 'exec', f'hflwan-dc{i}', sys.executable, 'main.py'] + margs,
          cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    status = None
    while status is None:
      codes = [q.poll() for q in procs]
      bad = [c for c in codes if c not in (None, 0)]
      if bad or all(c == 0 for c in codes):
        status = bad[0] if bad else 0
      elif time.monotonic() - t0 > args.timeout_s:
        status = 124
      time.sleep(0.2)
    print(f'[wan] finished with status {status} in {time.monotonic() - t0:.1f} s; logs in {logs}',
          flush=True)
    return status
  finally:
    for q in procs + ([line] if line is not None else []):
      if q.poll() is None:
        os.killpg(q.pid, signal.SIGTERM)
        try:
          q.wait(5)
        except subprocess.TimeoutExpired:
          os.killpg(q.pid, signal.SIGKILL)
    if not args.keep:
      teardown(num_dcs)


if __name__ == '__main__':
  sys.exit(main())
