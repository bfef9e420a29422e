#!/bin/bash
# usage: scripts/notify-thread-cpu.sh JAR
echo "# script ($0):"; sed "s/^/#   /" "$0"
# per-thread CPU (user/sys ticks) of both bench JVMs over 4 s of the measured phase
jar=$1
export KVFERRY_HOME=$(cd "$(dirname "$0")/.." && pwd)
java ${AB_JAVA_OPTS:-} -cp $jar dev.kvferry.cli.KvferryCli bench --only notify --round-trips 100000 2>/dev/null > /tmp/nab/thr-out.txt &
bp=$!
for i in $(seq 1 300); do cp=$(pgrep -P $bp -f "dev.kvferry.bench.NotifyEcho" | head -1); [ -n "$cp" ] && break; sleep 0.1; done
dp=$bp
sleep 14
snap() { for p in $dp $cp; do for t in /proc/$p/task/*; do echo "$p $(basename $t) x $(sed 's/.*) //' $t/stat | cut -d' ' -f12,13)"; done; done; }
jcmd $dp Thread.print > /tmp/nab/jd.txt; jcmd $cp Thread.print > /tmp/nab/jc.txt
snap > /tmp/nab/s1; sleep 4; snap > /tmp/nab/s2
grep ctxt /proc/$dp/status | head -0
wait $bp
grep -E "p50|p99|CPU" /tmp/nab/thr-out.txt | sed 's/RemoteBlocks.*JVMs;//'
python3 - $dp $cp <<'PY'
import sys,collections
dp,cp=sys.argv[1:3]
import re
names={}
for f,p in (('/tmp/nab/jd.txt',dp),('/tmp/nab/jc.txt',cp)):
    for l in open(f):
        m=re.match(r'"([^"]+)".* nid=0x([0-9a-f]+)',l)
        if m: names[(p,str(int(m.group(2),16)))]=m.group(1)
def rd(f):
    d={}
    for l in open(f):
        p,t,c,*r=l.split()
        if len(r)<2: continue
        d[(p,t)]=(c,int(r[0]),int(r[1]))
    return d
a=rd('/tmp/nab/s1'); b=rd('/tmp/nab/s2')
agg=collections.defaultdict(lambda:[0,0])
for k,(c,u,s) in b.items():
    if k in a:
        import re
        name=('decode ' if k[0]==dp else 'prefill ')+re.sub(r'\d+$','N',names.get(k,'?'))
        agg[name][0]+=u-a[k][1]; agg[name][1]+=s-a[k][2]
tot=collections.Counter()
for n,(u,s) in sorted(agg.items(), key=lambda kv:-sum(kv[1])):
    if u+s: print(f'{n:45s} user {u/4:5.1f}% sys {s/4:5.1f}% (of one core, 4 s)')
    tot[n.split()[0]+' user']+=u; tot[n.split()[0]+' sys']+=s
print({k:f'{v/4:.1f}%' for k,v in tot.items()})
PY
