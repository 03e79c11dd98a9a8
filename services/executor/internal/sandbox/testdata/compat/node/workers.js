// Each worker thread sums the squares of its own slice of [0, N) and posts
// the part back; the main thread adds the parts.
const { Worker, isMainThread, parentPort, workerData, threadId } = require('worker_threads');

const N = 1000000, WORKERS = 4;

if (isMainThread) {
  let total = 0n, done = 0;
  const ids = new Set();
  for (let i = 0; i < WORKERS; i++) {
    const w = new Worker(__filename, { workerData: i });
    w.on('message', ({ id, sum }) => { ids.add(id); total += BigInt(sum); });
    w.on('error', (e) => { console.error(e); process.exit(1); });
    w.on('exit', (code) => {
      if (code !== 0) { console.error(`worker exited ${code}`); process.exit(1); }
      if (++done === WORKERS) console.log(`workers=${ids.size} sum=${total}`);
    });
  }
} else {
  let s = 0n;
  for (let k = workerData; k < N; k += WORKERS) s += BigInt(k) * BigInt(k);
  parentPort.postMessage({ id: threadId, sum: s.toString() });
}
