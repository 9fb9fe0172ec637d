import os, time, statistics, torch, torch.distributed as dist, sys
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
import gradsched
dist.init_process_group("gloo")
rank = dist.get_rank()
def make():
    torch.manual_seed(0)
    layers=[nn.Linear(256,1024), nn.ReLU()]
    for _ in range(4): layers += [nn.Linear(1024,1024), nn.ReLU()]
    layers.append(nn.Linear(1024,10)); return nn.Sequential(*layers)
x = torch.randn(32,256); y = torch.randint(0,10,(32,))
policy = sys.argv[1]
model = make(); opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
if policy == "ddp": model = DDP(model)
else: model, opt = gradsched.wrap(model, opt, policy, trace="/tmp/prof.json")
ph = {"zero":[], "fwd":[], "bwd":[], "step":[]}
for it in range(40):
    dist.barrier()
    t0=time.perf_counter(); opt.zero_grad(); t1=time.perf_counter()
    loss = nn.functional.cross_entropy(model(x), y); t2=time.perf_counter()
    loss.backward(); t3=time.perf_counter()
    opt.step(); t4=time.perf_counter()
    if it >= 10:
        for k,a,b in (("zero",t0,t1),("fwd",t1,t2),("bwd",t2,t3),("step",t3,t4)): ph[k].append((b-a)*1e3)
if rank==0: print(policy, {k: round(statistics.median(v),2) for k,v in ph.items()}, "total", round(sum(statistics.median(v) for v in ph.values()),2))
if policy != "ddp": opt.close()
dist.destroy_process_group()
