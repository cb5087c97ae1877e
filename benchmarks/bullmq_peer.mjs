// BullMQ, the Node side of redis_peers.py: `node bullmq_peer.mjs add URL N` enqueues N
// no-op jobs (addBulk, 1,000 a call); `node bullmq_peer.mjs work URL CONCURRENCY` runs
// them and exits once the queue is drained. Completed jobs are kept (BullMQ's default,
// removeOnComplete unset), as conveyor keeps each finished job's record.
import { Queue, Worker } from "bullmq";

const [command, url, count] = process.argv.slice(2);
const parsed = new URL(url);
const connection = {
  host: parsed.hostname,
  port: Number(parsed.port || 6379),
  db: Number(parsed.pathname.slice(1) || 0),
  maxRetriesPerRequest: null,
};

if (command === "add") {
  const queue = new Queue("peers", { connection });
  const total = Number(count);
  for (let start = 0; start < total; start += 1000) {
    const jobs = [];
    for (let i = start; i < Math.min(start + 1000, total); i++) jobs.push({ name: "noop", data: {} });
    await queue.addBulk(jobs);
  }
  await queue.close();
} else if (command === "work") {
  const worker = new Worker("peers", async () => null, {
    connection,
    concurrency: Number(count),
    autorun: false,
  });
  worker.on("drained", async () => {
    await worker.close();
    process.exit(0);
  });
  worker.on("failed", (job, err) => console.error(`job ${job?.id} failed: ${err}`));
  await worker.run();
} else {
  console.error("usage: node bullmq_peer.mjs add URL N | work URL CONCURRENCY");
  process.exit(2);
}
