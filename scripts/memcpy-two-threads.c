/* One 8 MiB copy per round over 32 layer pairs (512 MiB, past the caches), on one thread or split
 * in halves with a second, spinning thread. A scratch check of memcpy scaling on this VM.
 * usage: gcc -O2 -pthread scripts/memcpy-two-threads.c -o /tmp/mc2 && /tmp/mc2 1; /tmp/mc2 2 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <stdatomic.h>
#define LAYER (8<<20)
#define NL 32
static char *src[NL], *dst[NL];
static atomic_int go, done; static int cur;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static void* helper(void*a){ int seen=0; for(;;){ while(atomic_load(&go)==seen); seen=atomic_load(&go); memcpy(dst[cur]+LAYER/2, src[cur]+LAYER/2, LAYER/2); atomic_fetch_add(&done,1);} }
int main(int argc,char**argv){
  int threads=atoi(argv[1]);
  for(int i=0;i<NL;i++){src[i]=aligned_alloc(4096,LAYER);dst[i]=aligned_alloc(4096,LAYER);memset(src[i],i,LAYER);memset(dst[i],0,LAYER);}
  pthread_t th; if(threads==2) pthread_create(&th,0,helper,0);
  double best[64]; int n=0;
  for(int r=0;r<3*NL;r++){ cur=r%NL; double t0=now();
    if(threads==1){memcpy(dst[cur],src[cur],LAYER);} else { int d0=atomic_load(&done); atomic_fetch_add(&go,1); memcpy(dst[cur],src[cur],LAYER/2); while(atomic_load(&done)==d0);}
    double t=now()-t0; if(r>=NL && n<64) best[n++]=t; }
  for(int i=0;i<n;i++)for(int j=i+1;j<n;j++)if(best[j]<best[i]){double x=best[i];best[i]=best[j];best[j]=x;}
  printf("threads=%d median %.0f us (%.2f GB/s) min %.0f\n",threads,best[n/2],LAYER/best[n/2]/1e3,best[0]);
}
