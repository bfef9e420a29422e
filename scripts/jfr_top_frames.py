# Summarizes jdk.ExecutionSample of a JFR file: with no window, samples per second since the first;
# with START END (seconds), samples by thread, by category (first match up the stack) and top frames.
# usage: python3 scripts/jfr_top_frames.py FILE.jfr [START END]
import sys,re,collections,json,subprocess
f=sys.argv[1]; t0s=float(sys.argv[2]) if len(sys.argv)>2 else None; t1s=float(sys.argv[3]) if len(sys.argv)>3 else None
d=json.loads(subprocess.run(['jfr','print','--json','--events','jdk.ExecutionSample',f],capture_output=True,text=True).stdout)
ev=d['recording']['events']
from datetime import datetime
def ts(s): return datetime.fromisoformat(s[:26].rstrip('Z')).timestamp()
times=[ts(e['values']['startTime']) for e in ev]
t0=min(times)
if t0s is None:
    c=collections.Counter(int(t-t0) for t in times); print(sorted(c.items())); sys.exit()
nm=lambda f: f['method']['type']['name'].split('/')[-1]+'.'+f['method']['name']
cats=[('serialize (Jackson)','JacksonSerializer.toBinary'),('serialize (Jackson)','JacksonSerializer.manifest'),('deserialize (Jackson)','JacksonSerializer.fromBinary'),
('artery encoder','Encoder$$anon$1.onPush'),('artery decoder','Decoder$$anon$2.onPush'),('artery inbound/dispatch','MessageDispatcher$.dispatch'),('tcp io (pekko.io)','TcpConnection'),('selector','SelectorImpl'),('actor mailbox','Mailbox.run'),('graph interpreter','GraphInterpreter')]
top=collections.Counter(); cat=collections.Counter(); n=0; thr=collections.Counter()
for e,t in zip(ev,times):
    if not (t0s<=t-t0<=t1s): continue
    st=e['values'].get('stackTrace')
    if not st: continue
    fr=[nm(x) for x in st['frames']]; n+=1
    thr[re.sub(r'-\d+$','',e['values']['sampledThread']['javaName'] or '')]+=1
    top[fr[0]]+=1
    for c,p in cats:
        if any(p in x for x in fr): cat[c]+=1; break
    else: cat['other']+=1
print('samples',n); print(thr.most_common())
for k,v in cat.most_common(): print(f'{v:5d} {100*v/n:5.1f}% {k}')
for k,v in top.most_common(20): print(f'{v:5d} {100*v/n:5.1f}% {k}')
