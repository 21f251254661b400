"""cxltier-events: prints what a node's KV event stream publishes, one line
per event, the way a router reads it (a ZMQ subscriber to the uplink's
--events, and its --events-replay for what was published before it came).
For checking a stream by eye; routers subscribe themselves.

    cxltier-events tcp://127.0.0.1:5557 --replay tcp://127.0.0.1:5558
    cxltier-events tcp://NODE:5557 --stored 4 --timeout 30   # exits 0 once 4 pages were announced

Needs pyzmq and msgpack (both in python/requirements-mooncake.txt)."""

import argparse
import sys
import time

from .kvevents import END_SEQ


def _unpack():
    try:
        import msgpack

        return lambda b: msgpack.unpackb(b, raw=False)
    except ImportError:
        import msgspec

        return msgspec.msgpack.Decoder().decode


def _field(event, name, index):
    """A field of an event as SGLang's publisher (tagged arrays) or
    cxltier's (maps) encodes it."""
    if isinstance(event, dict):
        return event.get(name)
    return event[index] if index < len(event) else None


def _hash(h):
    """A block hash (int64 on the wire) as 16 hex digits: the first 8 bytes
    of the page's key for cxltier's streams."""
    return f"{h & 0xFFFFFFFFFFFFFFFF:016x}" if isinstance(h, int) else repr(h)


def describe(seq, batch):
    """The lines of one KVEventBatch ([timestamp, events, dp rank])."""
    if not isinstance(batch, (list, tuple)) or len(batch) < 2 or not isinstance(batch[1], (list, tuple)):
        return [f"seq {seq}: not a KVEventBatch ({type(batch).__name__})"], 0
    lines, stored = [], 0
    for e in batch[1]:
        kind = _field(e, "type", 0)
        hashes = _field(e, "block_hashes", 1) or []
        if kind == "BlockStored":
            parent = _field(e, "parent_block_hash", 2)
            tokens = _field(e, "token_ids", 3) or []
            shown = " ".join(map(str, tokens[:6])) + (" ..." if len(tokens) > 6 else "")
            lines.append(f"seq {seq}: BlockStored {len(hashes)} page(s) {' '.join(map(_hash, hashes))}"
                         f" parent {'-' if parent is None else _hash(parent)}, {len(tokens)} tokens: {shown}")
            stored += len(hashes)
        elif kind == "BlockRemoved":
            lines.append(f"seq {seq}: BlockRemoved {len(hashes)} page(s) {' '.join(map(_hash, hashes))}")
        else:
            lines.append(f"seq {seq}: {kind}")
    return lines, stored


# A stream sends a batch (empty if need be) every second: this long a
# silence means a wrong endpoint or no uplink, which ZMQ never reports.
SILENT_HINT_S = 5.0


def main(argv=None):
    p = argparse.ArgumentParser(prog="cxltier-events", description="Prints a node's KV event stream.")
    p.add_argument("endpoint", help="the stream's endpoint (the uplink's --events), e.g. tcp://127.0.0.1:5557")
    p.add_argument("--replay", metavar="ENDPOINT", help="its replay endpoint: first prints what the node holds")
    p.add_argument("--stored", type=int, default=0, help="exit 0 once this many pages were announced stored")
    p.add_argument("--timeout", type=float, default=0, help="exit 1 after this many seconds (0: never)")
    p.add_argument("--heartbeats", action="store_true", help="print the empty batches too")
    args = p.parse_args(argv)
    try:
        import zmq
    except ImportError:
        sys.exit("cxltier-events: needs pyzmq (pip install --no-deps -r python/requirements-mooncake.txt)")
    unpack = _unpack()
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(args.endpoint)
    started = time.monotonic()
    deadline = started + args.timeout if args.timeout else None
    stored, last, heard = 0, -1, False
    if args.replay:
        last, stored = _replay(ctx, args.replay, unpack, deadline)
    try:
        while not args.stored or stored < args.stored:
            wait = 1000 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            if deadline is not None and wait == 0:
                print(f"cxltier-events: {stored} page(s) announced in {args.timeout:g} s, "
                      f"waited for {args.stored}", file=sys.stderr)
                return 1
            if not sub.poll(min(wait, 1000)):
                if not heard and time.monotonic() - started >= SILENT_HINT_S:
                    heard = True  # said once
                    print(f"cxltier-events: nothing from {args.endpoint} in {SILENT_HINT_S:g} s; a node's stream "
                          "sends a batch every second: is this the uplink's --events endpoint, and is it up?",
                          file=sys.stderr, flush=True)
                continue
            heard = True
            frames = sub.recv_multipart()
            if len(frames) != 3 or len(frames[1]) != 8:
                print(f"cxltier-events: a message of {len(frames)} frames, not a KV event batch", file=sys.stderr)
                continue
            seq = int.from_bytes(frames[1], "big")
            if seq <= last:
                continue  # the replay covered it
            last = seq
            lines, n = describe(seq, unpack(frames[2]))
            stored += n
            if lines or args.heartbeats:
                print("\n".join(lines) or f"seq {seq}: (empty)", flush=True)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        ctx.destroy(linger=0)


def _replay(ctx, endpoint, unpack, deadline):
    """Asks the replay socket for everything from sequence 0 (answered
    with what the node holds now) and prints it: (last sequence, pages
    stored)."""
    import zmq

    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    dealer.send_multipart((b"", (0).to_bytes(8, "big")))
    last, stored = -1, 0
    try:
        while True:
            wait = 10000 if deadline is None else max(1, int((deadline - time.monotonic()) * 1000))
            if not dealer.poll(wait):
                print(f"cxltier-events: no answer from the replay socket {endpoint}", file=sys.stderr)
                return last, stored
            frames = dealer.recv_multipart()
            if len(frames) != 4 or len(frames[2]) != 8:
                print(f"cxltier-events: a replay message of {len(frames)} frames ignored", file=sys.stderr)
                continue
            if frames[2] == END_SEQ:
                return last, stored
            seq = int.from_bytes(frames[2], "big")
            last = max(last, seq)
            lines, n = describe(seq, unpack(frames[3]))
            stored += n
            if lines:
                print("\n".join(lines), flush=True)
    finally:
        dealer.close(linger=0)


if __name__ == "__main__":
    sys.exit(main())
