"""What a local process that can map a driver's files does with a corrupt log frame, a full disk under the
archive and a flood of refused commands: the outcome for the victims, before and after a fix.

    python perf/local_attacks.py --label after
    PYTHONPATH=<old package tree> python perf/local_attacks.py --label before   # from a directory without logbuf/

Cases (each against a real driver; figures are outcomes and counts, not timings, so load does not move them):

- ``corrupt_frame/<case>``: three messages on an IPC stream, the second one's frame length overwritten by
  this process; a subscriber in a child process polls: its exit code, what it got, the exception it saw
  (or none in 3 s: a silent wedge); then the driver's unblocker (1 s timeout) at work: its counters and
  error log.
- ``full_disk_catalog``: a recorder on an 8 MiB tmpfs (mounted here; needs root) whose one-page catalog must
  grow for a 4th recording after the tmpfs is filled: the recorder's exit code and what it logged.
- ``error_log_flood``: 200 counters-full refusals, each naming another stream and channel: how many records
  the driver's distinct error log holds.

Writes ``perf/results/local_attacks_<label>.json``.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from _common import new_results, quiet, write_results

from logbuf.client import Aeron, Context, RegistrationError
from logbuf.conduit.cnc import CncFile
from logbuf.conduit.error_log import read_error_log
from logbuf.logbuffer import data_header_descriptor as dh
from logbuf.testing.driver_process import DEFAULT_ARGS, DriverProcess

INT32_MIN = -(2**31)
TERM = 64 * 1024
CASES: dict[str, tuple[int, int]] = {  # name: (frame type, frame length written at the second message)
    "length 1": (dh.HDR_TYPE_DATA, 1),
    "length 5": (dh.HDR_TYPE_DATA, 5),
    "length 31": (dh.HDR_TYPE_DATA, 31),
    "negative -5": (dh.HDR_TYPE_DATA, -5),
    "INT_MIN": (dh.HDR_TYPE_DATA, INT32_MIN),
    "past the term end": (dh.HDR_TYPE_DATA, TERM),
    "huge PAD": (dh.HDR_TYPE_PAD, 0x7FFFFFE0),
    "short PAD": (dh.HDR_TYPE_PAD, 7),
}

SUBSCRIBER = """
import json, sys, time, zlib
from logbuf.client import Aeron, Context
with Aeron.connect(Context(dir=sys.argv[1], driver_timeout_ns=8_000_000_000)) as aeron:
    sub = aeron.add_subscription("aeron:ipc", int(sys.argv[2]))
    print("ready", flush=True)
    sys.stdin.readline()
    got, error = [], None
    deadline = time.monotonic() + 3
    while error is None and time.monotonic() < deadline:
        try:
            sub.poll(lambda b, h: got.append((len(b), zlib.crc32(b))), 10)  # what a handler does with a payload
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
        time.sleep(0.001)
    print(json.dumps({"fragments": len(got), "lengths": [n for n, _ in got], "error": error}), flush=True)
    sys.stdin.readline()
"""


def driver_errors(directory: str) -> list[dict[str, Any]]:
    cnc = CncFile.open(directory)
    try:
        return [{"count": e.count, "text": e.text[-300:]} for e in read_error_log(cnc.error_log)]
    finally:
        cnc.close()


def counter(driver: DriverProcess, label: str) -> int | None:
    try:
        return driver.system_counter(label)
    except AssertionError:  # a driver without that counter
        return None


def corrupt_frame_case(
    driver: DriverProcess, name: str, frame_type: int, frame_length: int, stream_id: int
) -> dict[str, Any]:
    result: dict[str, Any] = {"case": f"corrupt_frame/{name}", "frame_length": frame_length}
    with subprocess.Popen(
        [sys.executable, "-c", SUBSCRIBER, driver.dir, str(stream_id)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdin is not None and child.stdout is not None
        try:
            assert child.stdout.readline().strip() == "ready"
            with Aeron.connect(Context(dir=driver.dir, driver_timeout_ns=8_000_000_000)) as aeron:
                pub = aeron.add_publication("aeron:ipc", stream_id)
                deadline = time.monotonic() + 20
                while not pub.is_connected and time.monotonic() < deadline:
                    time.sleep(0.01)
                positions = []
                for text in (b"m0", b"m1", b"m2"):
                    positions.append(pub.position)
                    while pub.offer(text) < 0:
                        time.sleep(0.001)
                term = pub._log_buffers.term_buffer(0)
                dh.HEADER.pack_into(term, positions[1], frame_length, 0, 0xC0, frame_type, positions[1], 0, 0, 0, 0)
                term.release()
                child.stdin.write("go\n")
                child.stdin.flush()
                line = child.stdout.readline()
                if line:
                    result["subscriber"] = json.loads(line)
                time.sleep(2.0)  # the driver's unblocker: 1 s timeout, then a look
                child.stdin.write("exit\n")
                child.stdin.flush()
        except (BrokenPipeError, AssertionError, ValueError) as e:
            result["harness"] = repr(e)
        try:
            result["subscriber_rc"] = child.wait(20)
        except subprocess.TimeoutExpired:
            child.kill()
            result["subscriber_rc"] = "killed"
        if result["subscriber_rc"] != 0:
            result["subscriber_stderr"] = (child.stderr.read() if child.stderr else "")[-400:]
    result["driver_alive"] = driver.alive
    return result


def fill(directory: str) -> None:
    with open(os.path.join(directory, "filler"), "wb", buffering=0) as f:
        for chunk in (1 << 20, 4096):
            while True:
                try:
                    f.write(bytes(chunk))
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break


def full_disk_catalog(driver: DriverProcess) -> dict[str, Any]:
    from logbuf.archive import catalog_descriptor as cat
    from logbuf.archive.catalog import Catalog

    result: dict[str, Any] = {"case": "full_disk_catalog"}
    mount_point = tempfile.mkdtemp(prefix="logbuf-perf-tmpfs-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", mount_point], check=True, timeout=30)
    try:
        archive = os.path.join(mount_point, "archive")
        Catalog.open_writable(archive, capacity=cat.HEADER_LENGTH + 3 * cat.ENTRY_LENGTH).close()
        log_path = mount_point + ".log"  # beside the tmpfs, not on it: the log must not fill with the disk
        with open(log_path, "wb") as out:
            recorder = subprocess.Popen(
                [sys.executable, "-m", "logbuf.archive.main", "-d", archive, "record", "--channel", "aeron:ipc",
                 "--stream-id", "16", "--driver-dir", driver.dir, "--segment-length", "128k"],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        with Aeron.connect(Context(dir=driver.dir, driver_timeout_ns=8_000_000_000)) as aeron:
            pubs = [aeron.add_exclusive_publication("aeron:ipc", 16) for _ in range(3)]
            for pub in pubs:
                deadline = time.monotonic() + 20
                while not pub.is_connected and time.monotonic() < deadline:
                    time.sleep(0.01)
                for _ in range(10):
                    while pub.offer(b"x" * 100) < 0:
                        time.sleep(0.001)
            time.sleep(1.0)
            fill(mount_point)
            fourth = aeron.add_exclusive_publication("aeron:ipc", 16)
            time.sleep(3.0)
            result["recorder_rc_after_4th"] = recorder.poll()
            published = 0
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and published < 200:
                if fourth.offer(b"y" * 100) > 0:
                    published += 1
            result["fourth_publisher_published_of_200"] = published
        if recorder.poll() is None:
            recorder.terminate()
            recorder.wait(10)
        result["recorder_rc"] = recorder.returncode
        with open(log_path, "rb") as f:
            lines = [line for line in f.read().decode(errors="replace").splitlines() if "error" in line.lower()]
        result["recorder_errors"] = [line[-300:] for line in lines[:3]]
        os.unlink(log_path)
    finally:
        if subprocess.run(["umount", mount_point], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", mount_point], check=True, timeout=30)
        os.rmdir(mount_point)
    return result


def error_log_flood(refusals: int) -> dict[str, Any]:
    driver = DriverProcess(
        args=[
            *DEFAULT_ARGS,
            "--counters-buffer-length",
            "16k",
            "--client-counters-share",
            "1",
            "--ipc-term-length",
            "64k",
        ]
    ).start()
    try:
        with Aeron.connect(Context(dir=driver.dir, driver_timeout_ns=8_000_000_000)) as aeron:
            held = []
            try:
                for stream_id in range(1, 200):
                    held.append(aeron.add_publication("aeron:ipc", stream_id))
            except RegistrationError:
                pass
            for i in range(refusals):
                try:
                    aeron.add_publication(f"aeron:ipc?alias=hog-{i}", 1000 + i)
                except RegistrationError:
                    pass
        records = [e for e in driver_errors(driver.dir) if "counters are full" in e["text"]]
        return {
            "case": "error_log_flood",
            "refusals": refusals,
            "records": len(records),
            "counted": sum(e["count"] for e in records),
        }
    finally:
        driver.stop()
        driver.remove()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", default="run")
    parser.add_argument("--skip-disk", action="store_true", help="skip the tmpfs case (it needs root)")
    args = parser.parse_args()
    quiet()
    results = new_results(f"local_attacks_{args.label}", load=os.getloadavg())
    driver = DriverProcess(
        args=[*DEFAULT_ARGS, "--ipc-term-length", "64k", "--publication-unblock-timeout", "1s"]
    ).start()
    try:
        for index, (name, (frame_type, frame_length)) in enumerate(CASES.items()):
            case = corrupt_frame_case(driver, name, frame_type, frame_length, 500 + index)
            results["cases"].append(case)
            print(json.dumps(case), flush=True)
        results["corrupt_frame_driver"] = {
            "alive": driver.alive,
            "unblocked_publications": counter(driver, "Unblocked Publications"),
            "corrupt_log_frames": counter(driver, "Corrupt log frames"),
            "errors": driver_errors(driver.dir),
        }
        print(json.dumps(results["corrupt_frame_driver"]), flush=True)
        if not args.skip_disk:
            case = full_disk_catalog(driver)
            results["cases"].append(case)
            print(json.dumps(case), flush=True)
    finally:
        driver.stop()
        driver.remove()
    case = error_log_flood(200)
    results["cases"].append(case)
    print(json.dumps(case), flush=True)
    write_results(results)


if __name__ == "__main__":
    main()
