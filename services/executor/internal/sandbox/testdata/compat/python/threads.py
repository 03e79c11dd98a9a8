# Each worker sums the squares of its own slice of range(N) in a thread of
# its own; the main thread adds the parts. A thread pool then does the same.
# Both totals, and how many distinct OS threads ran the work, are printed.
import concurrent.futures
import threading

N, WORKERS = 200000, 4
parts = [0] * WORKERS
native = set()
lock = threading.Lock()


def work(i):
    with lock:
        native.add(threading.get_native_id())
    return sum(k * k for k in range(i, N, WORKERS))


def store(i):
    parts[i] = work(i)


threads = [threading.Thread(target=store, args=(i,)) for i in range(WORKERS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("threads sum=%d" % sum(parts))

with concurrent.futures.ThreadPoolExecutor(max_workers=WORKERS) as pool:
    print("pool sum=%d" % sum(pool.map(work, range(WORKERS))))

native.discard(threading.get_native_id())
print("native threads>=%d" % min(len(native), WORKERS))
