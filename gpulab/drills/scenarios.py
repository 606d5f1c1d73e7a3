"""Scenario drills: the design and coding screens asked beyond the course's core questions, and the project story
(format: :mod:`gpulab.drills.questions`). Numbers in the samples are formulas on datasheet figures or name the lab
whose measurement the learner cites."""

SCENARIOS_TEXT = """
## Q-HW-4 | 20 min | labs 15 02 11
Implement streaming top-K in 20 minutes: scores arrive in chunks, keep the K largest (value and index) at all
times. Then re-architect it for 8 GPUs, each holding a shard of the scores.
- Single stream: a size-K min-heap (O(n log K)) or a buffer of 2K with a periodic partial sort; ties by index
- Chunked on the GPU: top-K per chunk (torch.topk or a per-row Triton kernel), merged with the running K
- Correctness: equal to a full sort on ties, K > n, empty chunks, NaN policy stated
- Multi-GPU: local top-K per shard, then merge K x 8 candidates (all-gather or a tree), never move the scores
- Merge bytes: 8 x K x (value + index) bytes, against the shard's own scan time
- Cites lab 15's top-K kernel, its merge-equals-whole check and its sharded top-K model
> Your merge moves [[B@merge|the candidates]] per query. At K=1000 and 8 GPUs, is the merge or the local scan the
  bottleneck for 10M scores per GPU?
> Two scores tie at the K-th place, one on GPU 0, one on GPU 5. Which one wins, and is it the same answer as a
  single-GPU sort?
> Queries arrive 1000 at a time. What changes in your design?
+ A min-heap of size K: push while smaller than K, else replace the root if larger; O(n log K), ties broken by
  the lower index so the result equals a stable sort (lab 15's merge-equals-whole check).
+ On a GPU: per-chunk torch.topk (or lab 15's Triton kernel), then merge the chunk's K with the running K.
+ 8 GPUs: each computes its local top-K (the scan reads 10M x 4 B = 40 MB, about 12 us at the H100's HBM
  bandwidth, formula); all-gather 8 x K (value, index) = 8 x 1000 x 8 B = 64 KB and merge: latency-bound, so a
  tree or one gather to rank 0; batch queries to amortise it.
~ Sort the scores and take the first K. On multiple GPUs, sort on each and combine.
! A full sort is O(n log n) and needs all the data; no streaming state, no ties, no merge cost.

## Q-SERVE-5 | 12 min | labs 15 14 11 16
Our approximate nearest-neighbour search has high recall, but multi-GPU latency is too slow. What do you measure
and what do you change?
- Measure the latency split: per-shard search, the merge (gather of K per shard), host-device copies, the queue
- Shard vs replicate: sharding the index makes every query wait for the slowest shard; replicas cut that
- IVF knobs: nprobe sets recall vs work; fewer lists probed per shard, or shard by list, not at random
- Batching queries to fill the GPUs, with a wait cap from the latency target; p99, not the mean
- Tail latency: the max of N shards' latencies grows with N; hedged requests or replication
- Cites lab 15's IVF nprobe sweep and its multi-GPU search latency model (lab 15, multi-GPU search)
> Your recall is [[%@recall|the figure you quoted]]. If you halve nprobe, what happens to recall and to each shard's
  work?
> With 8 shards, each with a p99 of 5 ms, why is the query's p99 worse than 5 ms?
> The index would fit on one GPU if stored in fp16 instead of fp32. Shard or replicate?
+ Split the latency first: per-shard search time, merge (gather K per shard), copies, queueing; the slowest shard
  sets each query's time.
+ If the index fits on one GPU (fp16 or PQ codes), replicate it: each query touches one GPU, no merge, and
  throughput scales with replicas.
+ If it must be sharded: shard by IVF list so a query probes few shards; batch queries; lower nprobe only with
  recall measured (lab 15's nprobe sweep); the model of shard vs replicate is lab 15's multi-GPU search.
+ p99 of the maximum of 8 shards is above each shard's p99: the tail compounds.
~ Add more GPUs to spread the index so each one has less to search.
! More shards make the tail worse; no latency split, no recall/nprobe trade-off, no replication.

## Q-HW-5 | 12 min | labs 15 01
Design a fair benchmark of gradient-boosted trees (GBDT) training on CPU vs multiple GPUs: which metrics,
which datasets, and what makes it fair?
- Metrics: time to a target accuracy (not time per iteration), end-to-end including data loading, cost per run
- Same model: same trees, depth, learning rate, histogram bins; the same accuracy reached on held-out data
- Datasets: several sizes and shapes (rows, features, sparsity, categorical), public and named (Higgs, Epsilon)
- Fair hardware: best CPU settings (all cores, its best library) vs the GPUs; report both machines and their price
- Warm-up, repeats, medians with spread; scaling from 1 to N GPUs (strong and weak)
- Cites lab 15's GBDT histogram and split exercises, and lab 01's benchmark discipline
> Your GPU run is [[x|several times]] faster. At the same final accuracy? With the CPU library's best
  settings?
> On a 10k-row dataset the CPU wins. Is your benchmark broken?
> Adding the second GPU gave 1.3x. Where did the rest go?
+ Time to the same validation metric, with data loading; per-iteration time only as a diagnosis.
+ Same hyper-parameters and bins on both; the CPU with all cores and its best settings; both machines' cost
  per hour, so the claim is per dollar too.
+ Datasets of different shapes (small, wide, sparse, categorical); report where the CPU wins (small data is
  launch- and transfer-bound).
+ Repeats, medians and spread (lab 01's benchmark); strong scaling 1 to 8 GPUs with the communication of
  histograms (an all-reduce per level, lab 15's histogram exercise) as the limit.
~ Train XGBoost on CPU and GPU on a large dataset and compare the training time.
! One dataset, one number, no accuracy parity, no CPU tuning, no spread: easy to make the GPU look good.

## Q-MLOPS-3 | 12 min | labs 01 16 17
Design CI that gates releases of a GPU-accelerated library on reproducible performance thresholds.
- Dedicated, pinned runners per GPU type (A100, H100...): clocks, driver, CUDA and library versions recorded
- Benchmarks done right: warm-up, synchronisation, many repeats, medians and spread, fixed inputs and seeds
- Thresholds relative to a stored baseline per GPU type, with a noise band from repeated runs
- Statistical gate: fail only when the change exceeds the noise (e.g. several runs, a confidence interval)
- Correctness checks before speed; results stored as data; a human override with a reason
- Cites lab 01's benchmark (median, p95/p99) and lab 17's compile reports as reproducible artifacts
> Your threshold is a [[%@regress|5%]] regression. What is the run-to-run noise on your runners, and how did you measure
  it?
> The H100 runner was upgraded to a new driver and everything got 3% faster. What does the gate do?
> A kernel is 10% faster on H100 but 4% slower on A100. Release or not?
+ Pinned runners per GPU type with recorded clocks and versions; fixed inputs, seeds and shapes.
+ Each benchmark: warm-up, synchronise, repeats, median and spread (lab 01); noise band measured from 20+ runs of
  the unchanged baseline on that runner.
+ Gate: regression beyond the noise band (e.g. the baseline's 99th percentile) on any GPU type fails; a baseline
  moves only with a reviewed change (a driver upgrade re-baselines).
+ Correctness first; results stored as JSON per run so trends are visible.
~ Run the benchmarks in CI and fail the build if it gets slower.
! "Slower" with no noise band, no per-GPU baseline, no pinned environment: flaky gates get ignored.

## Q-MLOPS-4 | 12 min | labs 01 11 16 12
Design a performance harness that runs the same workloads across A100, H100 and multi-node clusters and
produces numbers people can trust.
- Workload definitions as data: shapes, dtypes, model configs; the same code path on every machine
- Per-device expectations from datasheet ratios (bandwidth, FLOP/s) to spot a broken result, not as targets
- Environment captured: GPU, driver, CUDA, NCCL, topology (NVLink, IB), clocks, power limits
- Multi-node: collectives measured alone (bus bandwidth vs message size) before the full workload
- Results as versioned data, compared per device with spread; outliers investigated, not averaged away
- Cites lab 01's measured peaks, lab 11's collective formulas and lab 16's planner for the multi-node jobs
> You measured [[x|a speed-up]] for a memory-bound kernel from A100 to H100. What ratio did you expect, and what
  does a big miss tell you?
> The 2-node all-reduce reaches half of the IB bandwidth. Is that the harness, the network, or expected?
> How do you stop a noisy neighbour or thermal throttling from polluting a result?
+ One workload definition (data) run by the same code everywhere; environment, topology and clocks recorded.
+ Expectations from datasheet ratios: a memory-bound kernel about 1.6x from A100 to H100 (3.35 / 2.04 TB/s),
  compute-bound bf16 about 3x; a big miss is investigated.
+ Multi-node: nccl-tests style sweeps of message sizes first (alpha-beta fit), then the workloads; lab 11's
  formulas give the expected bus bandwidth.
+ Repeats with spread, exclusive nodes, clocks checked; results stored and compared per device.
~ Write a script that runs the models on each GPU and reports the time.
! No environment capture, no expectation to compare with, no collective baseline, no spread.

## Q-SERVE-6 | 12 min | labs 06 08 14 15 02
Design real-time video enhancement (for example 4K upscaling and denoising) under a strict per-frame latency
budget.
- Budget per frame: 60 fps leaves 16.7 ms end to end; split it into decode, upload, model, download, encode
- The model: its FLOPs per frame against the GPU's rate; precision (fp16/int8), fusion, TensorRT-style engines
- Pipelining across frames with CUDA streams: copy of frame n+1 overlaps compute of frame n
- Zero-copy paths: hardware decode into GPU memory, pinned buffers, no host round trips
- Tail latency: p99 frame time, dropped frames, warm-up and CUDA graphs to remove launch jitter
- Cites lab 15's overlapped pipeline model, lab 06's CUDA graphs and lab 08's int8 numbers
> Your model takes [[s@model|the time you quoted]] per frame. What is left for decode, copies and encode inside 16.7 ms,
  and does pipelining change the latency or only the throughput?
> One frame in 200 takes 40 ms. What do you look for?
> A 4K fp16 RGB frame: how long does its PCIe copy take each way, and can you avoid it?
+ 16.7 ms per frame at 60 fps; budget it: decode, upload, model, download, encode, with headroom.
+ A 4K fp16 RGB frame is 3840 x 2160 x 3 x 2 B = 50 MB: about 0.8 ms each way at 64 GB/s (PCIe Gen5,
  formula); better: hardware decode straight into GPU memory, so it never crosses.
+ Streams pipeline copies and compute (lab 15's model): throughput up, one frame's latency unchanged.
+ fp16/int8 engines, fused layers, CUDA graphs for jitter; p99 frame time and dropped frames as the metric.
~ Use a fast GPU and an optimised model so each frame is processed in time.
! No budget split, no copy arithmetic, no tail metric, no pipelining.

## Q-E2E-3 | 12 min | labs 07 03 16 08
You switch training to mixed precision (fp16 or bf16, maybe FP8). How do you detect that convergence suffers,
and how do you mitigate it?
- Compare with an fp32 (or bf16) baseline: loss curves within run-to-run noise, same data order and seeds
- Detect: loss scale history (fp16), overflow/skip counts, NaN/Inf checks, per-layer gradient and activation norms
- Causes: underflow of small gradients (fp16), accumulation in low precision, softmax/norm overflow
- Mitigate: dynamic loss scaling, bf16 instead of fp16, fp32 master weights and accumulation, fp32 softmax/norms
- FP8: per-tensor scaling (delayed amax), keep sensitive layers in higher precision
- Cites lab 07's GradScaler run (skipped steps, scale) and lab 03's accumulation error measurements
> Your loss curve is [[%@loss|some percent]] above the fp32 run at step 10k. Is that a difference or noise? How do you
  know?
> The GradScaler's scale keeps halving every few hundred steps. What is happening?
> bf16 trains fine but the eval metric is worse. Where do you look?
+ Baseline first: fp32 or bf16 runs with several seeds give the noise band; mixed precision must stay inside it.
+ Detect: loss-scale history and skipped steps (lab 07: steps skipped on overflow, the scale's path), NaN/Inf
  counters, per-layer gradient norms against their history.
+ Mitigate: bf16 (fp32's range), fp32 master weights and accumulation (lab 03: fp16 accumulation error),
  softmax and norms in fp32; FP8 with per-tensor scales and sensitive layers kept in bf16.
~ Use bf16 because it is more stable, and if the loss goes NaN, lower the learning rate.
! No baseline or noise band, no detection signal, a fix that guesses at the cause.

## Q-HW-6 | 12 min | labs 15 10 06 01
Refactor a data pipeline that feeds a GPU model so that it cuts host-device transfers. What do you measure and
what do you change?
- Measure: a timeline (Nsight Systems or the profiler) with copies, kernels and CPU gaps; bytes per step
- Move preprocessing to the GPU; transfer compact data (uint8 images, token ids), not float tensors
- Pinned memory and non_blocking copies on a side stream, overlapping the previous step's compute
- Keep intermediates on the GPU: no .cpu() / .item() inside the step (host syncs)
- Batch small transfers into one; cache what does not change on the GPU
- Cites lab 15's pinned vs pageable copy bandwidth and overlapped pipeline model, lab 06's host-sync count
> Your step copies [[B@cop|the bytes you quoted]] per step. At PCIe Gen5's 64 GB/s one way, how many milliseconds is
  that, and what share of the step?
> After pinning memory the copy got faster but the step did not. Why?
> The loss is logged with .item() every step. What does that cost?
+ Measure the timeline first: copy time, CPU gaps, host syncs (lab 06 counts them), bytes per step.
+ Send uint8 images (4x fewer bytes than fp32) and decode/normalise on the GPU; token ids, not embeddings.
+ Pinned buffers and non_blocking copies on a side stream, overlapped with compute (lab 15: pinned vs pageable
  bandwidth, the overlapped model).
+ Remove .item() and .cpu() from the step (log every N steps); re-measure step time, not just the copy.
~ Use a DataLoader with more workers and pin_memory=True.
! No measurement, no bytes, no overlap; more workers do not remove a host sync.

## Q-SERVE-7 | 12 min | labs 16 14
Design fault-tolerant serving with N+1 replicas on a fleet that mixes 8-GPU nodes of different kinds.
- Size N from the load and a measured per-replica capacity at the p99 target; add spares per failure domain
- Failure domains: a GPU, a node, a rack, a switch; a replica must not span two domains needlessly
- Mixed nodes: replicas per node kind, capacity weighted by each kind's measured throughput
- Health checks, draining, retries with budgets; the router avoids a degraded replica
- Headroom from a confidence bound on the load, not the mean; re-plan when a node kind is lost
- Cites lab 16's fault-tolerant serving plan (headroom, N+1) and its simulation
> You planned [[replicas|your N]] replicas plus one. One node kind is 40% slower. Is one spare still enough if a
  fast node dies at peak?
> A top-of-rack switch fails and takes 4 nodes. What does N+1 buy you then?
> How do you test the failover before it happens in production?
+ N from load / measured capacity per replica at the p99 target (lab 16's simulation), the load taken at an
  upper confidence bound.
+ Spares per failure domain: N+1 covers a node; a rack needs spare capacity across racks.
+ Mixed kinds: capacity weighted by measured throughput; losing a fast node removes more than 1/N.
+ Health checks, draining and retry budgets; game days that kill a node under load to prove it.
~ Run one extra replica so that if one fails the others take over.
! One spare for one node, no sizing from measurements, ignores racks and mixed capacities.

## Q-STORY-1 | 8 min | labs 02 06 08 10 14 15
Tell me about a project where you made something faster. What was the baseline, how did you find the bottleneck,
what did you change, and what did you measure at the end?
- Baseline with its number and how it was measured (warm-up, synchronisation, repeats)
- The profile or model that located the bottleneck (memory-bound? launch-bound? bytes?)
- The change, and why it addresses that bottleneck rather than another
- The measured gain, with the device and the spread; what it cost (memory, accuracy, complexity)
- What you would do next and what you learned
> You quoted [[x|a gain]]. Over how many runs, on which device, and what was the spread?
> Which part of the gain would disappear at 10x the problem size?
> What did you try that did not work?
+ Baseline: eager bias+GELU on the GPU, timed with warm-up and synchronisation (lab 02's table); the byte count
  showed two kernels moving about twice the bytes of one.
+ Change: one fused Triton kernel, one read and one write; checked against PyTorch within fp16 tolerance.
+ Gain: the measured fused vs eager time from the learner's own table (device named, median of repeats).
+ Cost and next step: a kernel to maintain; next, fuse into the matmul's epilogue.
~ I optimised a model and made it about twice as fast using Triton.
! "About twice" with no baseline, no profile, no device, no spread, no cost.
"""
