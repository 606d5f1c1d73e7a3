"""The course's interview questions as drills (format: :mod:`gpulab.drills.questions`), with their follow-ups and
calibration samples. Sample numbers are formulas on datasheet figures (the estimation set computes each) or name the
lab whose measurement the learner cites; none is a measured GPU figure."""

DRILLS_TEXT = """
## Q-OPT-1 | 15 min | labs 08 09 02 05 10 06 07
Walk me through the optimization techniques you would use to make a model train and serve faster. For each: the
goal, how it works, the benefit, the trade-off, a pitfall.
- Quantization: INT8 vs FP8, PTQ (calibration) vs QAT (fake quant), outliers and per-channel scales
- Pruning: unstructured vs structured vs 2:4 (N:M) sparsity, and which of them the hardware speeds up
- Distillation: a student on the teacher's soft targets (temperature), what it keeps and loses
- Fusion: bias+GELU saves memory round trips; FlashAttention never materialises the S x S scores
- Memory: activation checkpointing (memory for one more forward), ZeRO/FSDP sharding, offload, KV cache
- Throughput/latency: mixed precision, CUDA graphs and torch.compile, batching, compute/comm overlap
- Cites a measured number from a lab for at least two techniques
> Say you prune unstructured to 90% sparsity. On a dense GPU matmul, how much faster is the pruned model, and
  what would you change so the hardware actually skips the zeros?
> Your fused kernel saves [[B@fus|the bytes you quoted]]: at what tensor size does that stop mattering against one
  kernel launch (a few microseconds)?
> Which of your techniques change the model's accuracy, and how would you show the change is acceptable?
+ Quantization: int8 weight-only halves the bytes a memory-bound decode step reads (lab 08: int8 vs fp16 GEMV
  bytes and time); per-channel scales because one outlier row ruins a per-tensor scale; PTQ first, QAT if it drops.
+ Pruning: unstructured zeros do not speed up a dense matmul (lab 09 timed 0.9 sparsity at the dense time); 2:4
  does on sparse tensor cores; structured (whole units) shrinks the matmul itself.
+ Fusion and memory: bias+GELU fused reads and writes once (lab 02's byte count); FlashAttention drops the S x S
  traffic (about 1 + S/d less); checkpointing trades one more forward for activation memory (lab 10).
+ Each with its trade-off and a pitfall, and a measurement before and after.
~ I would quantize the model, prune it, distill it and use FlashAttention and torch.compile. These all make it
  faster and use less memory.
! No numbers, no trade-off, no pitfall, no measurement: a list of names, not an answer.

## Q-OPT-2 | 10 min | labs 08 14 07
You must serve a 7B LLM at half the memory. How do you quantize it, and how do you know it still works?
- Weight-only int8/int4 vs W8A8 vs FP8: what each saves (bytes read per decode step) and needs
- Calibration data and per-channel / per-group scales; activation outliers (SmoothQuant-style shift)
- PTQ first, QAT only if accuracy drops; evaluate on the task, not just perplexity
- Decode is memory-bound: the speed-up follows the bytes, not the FLOPs
- KV-cache quantization as a separate lever for long contexts
> Int8 halves the weights' memory. At 4k context and batch 32, is the KV cache now bigger than the weights?
  (Llama-2-7B: 512 KiB of fp16 KV per token.)
> Perplexity moved by 0.1. Why is that not enough evidence, and what would you measure instead?
> You expect [[x|a speed-up]] from int8 weights. Your kernel dequantizes them to fp16 in memory before the
  matmul: what happens to it?
+ Weight-only int8 (per-channel scales): 14 GB -> 7 GB; decode reads half the bytes, so up to 2x per token
  (lab 08's GEMV: int8 in-kernel vs fp16). Int4 with per-group scales (group 128) for 4x, with more error.
+ Calibrate on a few hundred real prompts; handle activation outliers (SmoothQuant) if going W8A8.
+ Check on the task's own evaluation and on long prompts, not only perplexity; keep fp16 layers where error
  concentrates (first/last).
+ Then the KV cache: 512 KiB/token in fp16, 64 GiB at batch 32 x 4k, so it needs its own int8/fp8 plan.
~ Use int8 quantization, it halves the memory. Then check the accuracy is still fine.
! No scales or calibration, no test beyond "accuracy", no KV cache, no measured bytes or time.

## Q-PAR-1 | 12 min | labs 12 13 11 16
Tensor parallelism vs pipeline parallelism: how does each work, what does it communicate, when do you use which,
and what limits it?
- TP: column- then row-parallel linears, 2 all-reduces per layer in the forward (2 in the backward)
- PP: layers split into stages, activations sent point to point; GPipe vs 1F1B schedules
- Bubble (p-1)/(m+p-1), mitigated by more microbatches and interleaved stages
- TP inside an NVLink node, PP across nodes: message size and frequency decide
- Bottlenecks: per-layer all-reduce latency; stage imbalance; activation memory of in-flight microbatches
- Hybrid 3D: TP x PP x DP (plus sequence/expert parallelism), with a worked layout
- Cites measurements: lab 13's measured bubble against (p-1)/(m+p-1), lab 16's planner against Megatron-LM's
  published 145.6B layout
> 32 heads at TP=8 is fine: 4 per GPU. What if the model has 8 KV heads (GQA) and you want TP=16?
> Your bubble is [[%@bubble|the fraction you quoted]] with p=8. How many microbatches keep it under 10%, and what does
  that cost in activation memory under 1F1B vs GPipe?
> Why not TP=16 across two nodes? Put numbers on one layer's all-reduces over NVLink vs InfiniBand.
+ TP splits each matmul (column- then row-parallel): 2 all-reduces of the activations per layer forward, 2 more
  in backward; at batch 8 x 2048 x 8192 bf16 that is 537 MB per layer, about 2.1 ms on NVLink at TP=8 (formula).
+ PP splits the layers: point-to-point activations only, but a bubble of (p-1)/(m+p-1): 18% at p=8, m=32
  (lab 13 measured its own schedule against the formula).
+ So TP inside the node (NVLink), PP across nodes, DP over the rest: Megatron-LM's published 145.6B run used
  TP=8 x PP=8 on 1536 GPUs (lab 16's planner checks its layout against it).
+ Limits: TP by heads (GQA: at most KV-heads-way without replicating K/V) and by all-reduce latency; PP by
  imbalance and in-flight activations.
~ Tensor parallelism splits the tensors across GPUs and pipeline parallelism splits the layers. Use TP for big
  layers and PP for many layers.
! No communication volumes, no bubble formula, no topology argument, no layout with numbers.

## Q-E2E-1 | 15 min | labs 01 06 07 10 11 16
A large training job runs at 25% MFU. Optimize it end to end: what do you measure first and what do you try
next?
- Measure first: a per-step profile split into compute, memory-bound kernels, communication, idle
- Precision: bf16 (or fp16 with loss scaling), FP8 where supported; fp32 accumulation
- Kernels: fusion, FlashAttention, custom Triton kernels; coalescing; no host syncs in the step
- Parallelism: DP/TP/PP/EP chosen from memory and the links (a planner, not guesswork)
- Communication: overlap all-reduce with backward, gradient bucketing, NCCL tuning, topology
- Memory: checkpointing and ZeRO to fit larger microbatches; the data loader keeps up
> You said [[%@MFU|25%]] MFU: how did you compute it? Which FLOP count per token, and which peak did you divide by?
> Your profile shows 30% of the step in NCCL with nothing overlapping it. What exactly do you change first?
> Activation checkpointing costs a forward. Your MFU goes down but the run is faster: how can both be true?
+ MFU = 6 x params x tokens/s / peak (dense bf16): 13B at 4000 tokens/s per H100 is 31.5% (formula); say which
  peak and whether attention FLOPs count.
+ Profile one step: compute vs memory-bound kernels vs NCCL vs idle; fix the largest slice first, re-measure.
+ Typical order: bf16 and FlashAttention, fused kernels and no host syncs (lab 06 counts them), overlap and
  bucketing of the all-reduce, then a planner-chosen layout; checkpointing to grow the microbatch.
+ Each change measured in tokens/s and MFU with the same definition, so gains add up honestly.
~ I would use mixed precision, torch.compile and a bigger batch, and check that the GPUs are busy.
! Never says how MFU is computed or what the profile shows; no order of attack, no re-measurement.

## Q-E2E-2 | 12 min | labs 14 08 06
Optimize LLM inference end to end, once for an online (latency) service and once for batch (throughput) jobs.
- Online: TTFT and time per output token, p99 not mean; batch: tokens/s per GPU and cost
- Prefill is compute-bound, decode memory-bound: different levers for each
- KV cache with paging, continuous batching, chunked prefill or prefill/decode disaggregation
- Quantization (weights, KV), speculative decoding, CUDA graphs for decode steps
- Batch jobs: the largest batch memory allows, sorted lengths, offline scheduling
> Your decode step takes [[s@decode|the time you quoted]] at batch 1. What is the weight-read floor for a 7B fp16
  model on an H100, and how far above it are you?
> Speculative decoding with a draft model: when does it make the p99 worse?
> Continuous batching raised throughput but TTFT p99 doubled. Why, and what do you change?
+ Online: p99 TTFT and time per output token; decode is memory-bound, floor = weight bytes / bandwidth (7B fp16 on
  an H100: 4.2 ms per token, formula), so int8/int4 weights, CUDA graphs for the step, speculative decoding.
+ Prefill is compute-bound: chunked prefill or separate prefill replicas so long prompts do not stall decodes.
+ Batch: the largest batch the KV cache allows (paged), continuous batching, sorted lengths; tokens/s per GPU
  and cost per token (lab 14: static vs continuous throughput and p99).
~ For online I would make the model smaller and faster; for batch I would use large batches.
! No metrics (TTFT, per-token, p99), no prefill/decode split, no floor, no measurement.

## Q-COMP-1 | 12 min | labs 06 01
What happens between `model(x)` in PyTorch and kernels running on the GPU, with and without torch.compile? How
would you show a compiler win is real?
- Eager: one kernel launch per op, Python overhead per op
- TorchDynamo captures bytecode into FX graphs, with guards; graph breaks fall back to eager
- AOTAutograd traces the joint forward/backward; Inductor lowers to Triton kernels or library calls
- Static vs dynamic shapes: guards, recompiles, bucketing or mark_dynamic
- Benchmark: warm-up (compile excluded), device synchronisation, p50/p95/p99, memory, utilisation
> You measured a [[x|speed-up]] from torch.compile. Was compile time inside the timed region, and did you
  synchronise the device before stopping the clock?
> Sequence lengths vary per request. How many recompiles do you expect, and how do you bound them?
> The compiled model has 3 graph breaks. How do you find them and which ones matter?
+ Eager: Python dispatches one kernel per op; small ops are launch-bound.
+ Dynamo captures bytecode into FX graphs guarded on shapes and dtypes (a guard failure recompiles; a graph break
  falls back to eager), AOTAutograd traces forward and backward together, Inductor fuses into Triton kernels or
  calls cuBLAS.
+ Dynamic shapes: pad to buckets or mark_dynamic, else one compile per new length (lab 06 counted them).
+ Proof: warm-up excluded, synchronise, many repeats, p50/p99, same inputs; lab 06's eager vs compiled times.
~ torch.compile converts the model to a faster graph and runs it on the GPU. I would time it before and after.
! No Dynamo/AOTAutograd/Inductor, no guards or breaks, no benchmarking discipline.

## Q-HW-1 | 10 min | labs 01 02 04 15 07
Is this kernel memory-bound or compute-bound, and what would you change? Explain the metrics you use.
- Arithmetic intensity (FLOP/byte) against the ridge point of the roofline
- Achieved bandwidth or FLOP/s as a share of a measured peak
- Occupancy, coalescing, tiling for reuse (matmul), fusion to cut bytes
- Throughput vs latency; strong vs weak scaling and Amdahl's law
- Mixed precision and accumulation; determinism; reproducible benchmarks
- GPU-friendly algorithms (batched k-means, top-k, vector search); fewer host-device transfers
> Say it is memory-bound and reaches [[%@peak|some share]] of peak bandwidth: peak as in the datasheet, or as measured
  by a copy on this GPU? Why does it matter?
> A 4096^3 fp16 matmul: what intensity, and where is the H100's ridge? Now batch-1 decode, the same weight.
> Your fix doubles the FLOPs but halves the bytes. When is that a win?
+ Intensity = FLOPs / bytes moved against the ridge (H100 fp16: 989 TFLOP/s / 3.35 TB/s = 295 FLOP/B,
  datasheet): a 4096^3 matmul is 1365 FLOP/B (compute-bound), a batch-1 GEMV about 1 (memory-bound).
+ Then measure achieved GB/s or TFLOP/s as a share of a measured peak (lab 01: copy bandwidth, matmul rate).
+ Memory-bound: fuse, coalesce, lower precision; compute-bound: tensor cores, tiling for reuse, occupancy.
~ If it uses lots of memory it is memory-bound, otherwise compute-bound. I would optimise the slow part.
! No intensity, no ridge, no achieved-vs-peak number: the question's own metrics are missing.

## Q-HW-2 | 15 min | labs 17 02 04
Write a CUDA C++ kernel that sums a large float array, with its launch, then tell me how you would check it and
make it faster.
- Indexing: blockIdx.x * blockDim.x + threadIdx.x, a grid-stride loop, the tail guarded (i < n, 0 past the end)
- Shared-memory tree with __syncthreads() after the load and after every step; never a barrier in a divergent branch
- Warp-level finish with __shfl_down_sync (offsets 16 to 1; the full mask only when all 32 lanes execute it)
- One atomicAdd per block or a second pass; float order changes the sum, so compare within a tolerance
- Host side: an RAII device buffer, cudaGetLastError after the launch, errors at the sync, events for timing
- Cites lab 17's compile report: SHFL and BAR in block_sum's SASS, its registers, no spills
> Your kernel reaches [[B/s|some bandwidth]]. What is the most it could reach, and how many blocks do you launch
  to get there?
> Your result differs from numpy's float64 sum in the 5th digit. Bug or not? How do you decide?
> What happens if n is not a multiple of your block size and you drop the guard?
+ Grid-stride loop with the tail guarded, each thread accumulating in a register; a shared-memory tree with
  __syncthreads after each step, a __shfl_down_sync finish for the last warp, one atomicAdd per block.
+ Check against a float64 reference within a tolerance that grows with n (order changes the float sum); odd n,
  n = 0 and n = 1 in the tests.
+ Faster: it is memory-bound (0.25 FLOP/B in fp32), so the target is the measured copy bandwidth; vector loads,
  enough blocks to fill the SMs; lab 17's SASS shows SHFL and BAR and no spills.
~ Each thread adds one element to a global total with atomicAdd. I would test it against numpy.
! One atomic per element serialises; no tree, no tail, no tolerance argument, no bandwidth target.

## Q-HW-3 | 12 min | labs 17 04 01
Given a kernel with poor occupancy, walk through your profiling and optimization steps.
- First ask whether occupancy is the problem: achieved vs theoretical occupancy and stall reasons (Nsight Compute)
- Find the limiter from the compile report (registers, shared memory, block size) and the occupancy calculation
- Registers: fewer live values, no __launch_bounds__ that forces spills (spills are local-memory traffic)
- Shared memory: smaller tiles or fewer stages; block size: smaller blocks so several fit on an SM
- Re-measure time and DRAM throughput: more occupancy can lose to more ILP in a compute-bound kernel
- Cites lab 17's smooth_slow vs smooth_fast: registers, spills and blocks per SM from nvcc's report
> You raised occupancy from [[%@occupancy|the figure you quoted]]. The kernel got slower. Give two reasons that
  can happen.
> 128 registers per thread with 256-thread blocks: how many blocks fit on an SM with 64K registers?
> Nsight says "long scoreboard" stalls dominate. Is more occupancy the fix?
+ First, does it matter: achieved occupancy and stall reasons; a latency-bound kernel with few warps benefits,
  a compute-bound one with ILP may not.
+ The limiter from the compile report: 128 registers x 256 threads = 32K registers, so 2 blocks (16 warps of 64)
  per SM from registers; shared memory and block limits likewise (lab 17's calculator).
+ Fix the limiter (fewer live values, no forced spills, smaller tiles), then re-measure time and DRAM throughput.
~ Poor occupancy means the GPU is not full, so I would launch more threads per block.
! Never checks whether occupancy is the limiter, no calculation, no re-measurement.

## Q-DIST-1 | 12 min | labs 10 11 16
Design distributed training of a 13B model on 64 GPUs: DDP, FSDP or ZeRO? Show the memory and the communication.
- Model state 16 bytes per parameter; ZeRO-1/2/3 divide optimizer, gradients, weights by N
- Communication: DDP's all-reduce is a reduce-scatter plus an all-gather (2x the gradient bytes); ZeRO-3/FSDP
  moves about 1.5x DDP's bytes (an all-gather of the weights in forward, another in backward, one reduce-scatter)
- Overlap and bucketing; prefetching the next FSDP unit
- Activations: checkpointing, microbatch size; when TP within the node helps
- Sharded checkpoints; restart on a different GPU count
- Cites lab 16's memory per GPU by ZeRO stage (training_memory) and lab 11's measured all-reduce bytes
> Does FSDP's all-gather of one unit (one of 40 layers of the 13B model) hide behind its compute at 400 Gb/s per
  GPU? Put numbers on both.
> You quoted [[B@GPU|a memory figure]] per GPU. Does it include activations? How large are they at your microbatch?
> A node dies and you restart on 56 GPUs. What happens to your sharded checkpoint?
+ Model state 16 B/param = 208 GB per GPU under DDP: does not fit. ZeRO-1 54 GB, ZeRO-2 29 GB, ZeRO-3 3.3 GB per
  GPU on 64 (formulas; lab 16's training_memory).
+ Communication per step: DDP 2(p-1)/p x 26 GB = 51 GB per GPU; FSDP 1.5x that, 77 GB (lab 11 measured the
  ratio).
+ Overlap: one unit's all-gather at 50 GB/s takes about 13 ms against about 2.7 ms of forward at peak for 4096
  tokens: it does not hide, so more tokens per GPU, hybrid sharding (FSDP inside the node, DDP across) or TP.
+ Checkpointing for activations; sharded, re-shardable checkpoints.
~ FSDP, because it shards the model so it fits in memory. It is a bit slower than DDP.
! No per-GPU memory, no bytes per step, no overlap check: "a bit slower" is not a number.

## Q-DIST-2 | 12 min | labs 16 11 07
A 2000-GPU run fails every few hours and diverged twice. What do you build and what do you look at?
- Job MTBF = one GPU's MTBF / N; checkpoint every sqrt(2 C M) (Young/Daly); async, sharded saves
- Elastic restart: re-shard the checkpoint to the new world size; resume data order and LR schedule
- Stragglers and hangs: per-rank step times (medians), NCCL timeouts, a watchdog, stack dumps
- Divergence: first spike, per-layer gradient norms against their own history, loss scale, batch ids
- Fixes: skip/replay a bad batch, lower LR or longer warm-up, clipping, bf16, QK-norm
- Cites lab 16's checkpoint interval for 16384 GPUs and its diagnosis of the supplied divergence traces
> You checkpoint every [[s@every|your interval]]. A save takes 60 s and the job fails every 3 hours: what does
  Young/Daly give, and how much of the run do you lose to saves and rework?
> One rank's step time is 1.3x the median. Straggler or noise? What do you check?
> The loss spiked at step 41k. Which three numbers do you pull first?
+ Job MTBF = GPU MTBF / N (the Llama 3 run: 419 interruptions in 54 days, about 3.1 h); Young/Daly
  sqrt(2 x MTBF x C) = about 19 min for a 60 s save (formula); async sharded saves to cut C.
+ Elastic restart: re-shard to the new world size, restore data order and LR schedule.
+ Per-rank step-time medians to find stragglers; NCCL timeouts and a watchdog for hangs.
+ Divergence: the first spike, per-layer gradient norms against their history, the batch ids; fixes: skip the
  batch, lower LR, clip, QK-norm (lab 16's traces).
~ Save checkpoints often and restart when it crashes. For divergence, lower the learning rate.
! "Often" has no interval, no MTBF arithmetic, no diagnosis before the fix.

## Q-SERVE-1 | 15 min | labs 14 16 12 08
Serve a 175B model at 100 requests/s with p99 latency under 500 ms on 8-GPU nodes.
- Weights: 350 GB in bf16, 175 GB in fp8: TP=8 inside a node (never across nodes)
- KV cache per token and the concurrency (Little's law) that must fit beside the weights
- Decode step floor: weight bytes per GPU / HBM bandwidth, plus 2 all-reduces per layer
- Prefill vs decode: chunked prefill or separate prefill replicas so decodes do not stall
- Continuous batching; replicas from a queueing model or simulation, with headroom for p99
- What to monitor: TTFT, per-token latency, p99, queue length, KV occupancy
- Cites lab 16's simulated plan (replicas x TP, its p99 from the simulation, not a mean) and KV GB per GPU
> Your p99 is [[s@p99|the figure you gave]] against 500 ms: what is the error bar on it, and what happens if one node
  dies?
> 96 heads at TP=8 is fine. What if the model had 8 KV heads (GQA) and you wanted TP=16 to cut latency?
> Where does the KV cache for your concurrency live: how many GB per GPU are left after the weights?
+ 350 GB bf16 or 175 GB fp8: TP=8 in a node, 22-44 GB of weights per GPU; decode floor in fp8 at TP=8 is
  about 6.5 ms per step plus 2 all-reduces per layer (formula).
+ Little's law for the sequences in flight; their KV must fit in what the weights leave per GPU.
+ Replicas from lab 16's simulation (its p99, not a mean), plus N+1 so one node down still meets the p99; the
  p99's error bar from repeated runs or a bootstrap.
+ Chunked prefill or separate prefill replicas; monitor TTFT, per-token p99, queue, KV occupancy.
~ Use 8 GPUs with tensor parallelism and add more servers until the latency is under 500 ms.
! No weight or KV arithmetic, no simulation or p99 reasoning, no headroom for a failure.

## Q-SERVE-2 | 10 min | labs 16 08 06 02
Design a ResNet-152 image-classification service with a latency target.
- Dynamic batching with a maximum wait: batch size bounded by the target, not by memory
- Fusion (conv + batch-norm + ReLU folded, TensorRT-style), fewer launches
- INT8 with calibration (or FP8); check accuracy per class
- CUDA graphs, several model instances or streams per GPU, GPU-side preprocessing
- Throughput per GPU at the target, replicas for the load
> Your max batch wait is [[s@wait|the wait you chose]]. Against a 50 ms p99, how much is left for the model, and which
  batch size fits?
> INT8 lost 0.3% top-1 overall. Why is that not the whole story?
> JPEG decode on the CPU takes longer than the model. What now?
+ Dynamic batching with a wait cap: wait + batch latency < target; pick the batch from a measured latency curve.
+ Fold batch-norm into the convs, fuse activations, CUDA graphs; INT8 with calibration, checked per class.
+ GPU-side decode and resize (the CPU is often the bottleneck); replicas = load / throughput at the target, plus
  headroom (lab 16's batching math).
~ Deploy ResNet-152 on a GPU with TensorRT and batch the requests.
! No wait cap or latency budget, no per-class accuracy check, no preprocessing, no capacity arithmetic.

## Q-SERVE-3 | 8 min | labs 14 12 13 16
A 7B LLM on 4 GPUs at low latency: TP, PP or replicas?
- It fits one GPU: replicas give the most throughput at one GPU's latency
- TP=4 cuts each decode step's weight reads by 4, plus 2 all-reduces per layer on NVLink
- PP does not reduce a token's latency; it adds throughput only with microbatches in flight
- Choose by the latency target: TP for the lowest per-token latency, replicas otherwise
- Cites lab 16's four_gpu_options latencies and tokens/s for the three choices
> Your TP=4 plan's time per token is [[s|what you estimated]]. The weight-read floor at TP=1 is about 4.2 ms
  (fp16, H100): what stops TP=4 from reaching a quarter of it?
> The GPUs are on PCIe, not NVLink. Does your answer change?
> Traffic doubles next month. Which choice scales, and why?
+ Fits one GPU (14 GB): 4 replicas give 4x the throughput at one GPU's latency (about 4.2 ms floor per token).
+ TP=4 reads a quarter of the weights per step (about 1 ms floor) but adds 64 all-reduces per token (2 x 32
  layers): on NVLink a few microseconds each, on PCIe tens (lab 12's model).
+ PP: no latency gain for one sequence. Choose TP if the per-token target needs it, replicas otherwise (lab 16's
  four_gpu_options).
~ Use tensor parallelism on all 4 GPUs since it is the fastest.
! No floor per token, no all-reduce cost, ignores that replicas win on throughput.

## Q-SERVE-4 | 10 min | labs 16 06 11 01
A multi-GPU deployment is much slower than expected. Debug it methodically.
- Reproduce and measure: per-rank timelines (Nsight Systems, PyTorch profiler)
- Compare ranks first: one slow rank makes the others wait inside NCCL
- Split the step: kernels vs NCCL vs CPU gaps vs host-device copies
- Check the partition and the communication pattern (TP across nodes? overlap?)
- Check memory (fragmentation, KV pressure, swapping) and batch size; fix one thing, re-measure
> NCCL shows [[%@NCCL|a share]] of the step on every rank. Is NCCL slow, or is one rank late? How do you tell?
> "Much slower than expected": expected by what model? Give the number you expected and how you got it.
> After your fix the median improved but p99 did not. What next?
+ Expected first: a model of the step (FLOPs / peak, bytes / bandwidth, collectives by alpha-beta) so "slow"
  has a number.
+ Per-rank timelines: a rank whose kernels take 1.5x the median makes the others wait inside NCCL; the NCCL time
  is then a symptom (lab 16's supplied profiles).
+ Split kernels / NCCL / CPU gaps / copies; check TP across nodes, overlap, batch size, memory; fix one thing and
  re-measure.
~ I would check the GPU utilisation and the network, and update the drivers.
! No expected number, no per-rank comparison, no method: guesses instead of measurements.

## Q-MLOPS-1 | 12 min | labs 16 14
Design the production pipeline around an LLM service: what do you monitor, how do you version models, and how do
you roll out a new one?
- Monitor latency percentiles (TTFT, p99), throughput, GPU and KV-cache utilisation, errors
- Drift: live inputs vs training data (PSI per feature), prediction and quality drift
- A registry of immutable, versioned artifacts (weights, tokenizer, engine, config, data, code)
- Shadow traffic, then a canary slice compared with the baseline on enough requests
- Automatic rollback on an SLO or guardrail breach; rollback is a pointer change
> Your canary gets [[%@canary|a slice]] of traffic. How many requests before its p99 is comparable with the baseline's?
> The new model's engine was rebuilt with a new TensorRT version. Is that a new model version?
> What triggers an automatic rollback, and how long does it take?
+ Monitor p50/p99 TTFT and per-token latency (lab 14's metrics), throughput, KV occupancy, errors, and quality
  proxies; lab 16's MLOps checklist for the rest.
+ Registry: immutable artifacts (weights, tokenizer, engine, config, code, data hash); any change is a version.
+ Shadow, then a canary of a few percent; enough requests for the p99 to be stable (a p99 needs hundreds of
  samples above it), compared with the baseline; rollback is a pointer change on an SLO breach.
~ Monitor the service with dashboards, version the models in git and roll out slowly.
! No metrics named, no canary size, no rollback trigger.

## Q-MLOPS-2 | 10 min | labs 16
How do you run an A/B test of a new model, and how do you detect data drift in production?
- Randomisation unit, sample size from the effect you must detect, a pre-registered metric
- Guardrail metrics (latency, errors) and a significance test; beware peeking and novelty effects
- Drift: PSI or KS per feature, prediction distribution, delayed labels
- Responses: alert, investigate, retrain with review; never retrain blindly on every alert
> You need to detect a [[%|1%]] change. With your traffic, how long does the test run?
> PSI on one feature jumped to 0.3 overnight. What do you do, in order?
> The A/B result flipped after two weeks. Why can that happen?
+ Unit (user, not request), a pre-registered metric, sample size from the minimum effect (n grows as 1/effect^2),
  a fixed duration (no peeking), guardrails on latency and errors.
+ Drift: PSI/KS per feature against training (PSI of 0.25 or more is a shift, as in lab 16's rollout checks),
  prediction distribution, delayed labels.
+ On alert: investigate first (pipeline bug? real shift?), then retrain with review.
~ Split the traffic in two, compare the metrics and pick the better model. Retrain when drift happens.
! No sample size, no unit, no guardrails, no drift statistic.
"""
