// create (+ optional 4 KiB write) / close, then unlink, in one directory;
// prints ns per create and per unlink.
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
int main(int argc,char**argv){
  const char*dir=argv[1]; int n=atoi(argv[2]); int wr=atoi(argv[3]); int rounds=argc>4?atoi(argv[4]):1;
  char p[4096]; static char buf[1<<20]; memset(buf,0x5a,sizeof buf);
  mkdir(dir,0755);
  for(int r=0;r<rounds;r++){
    double t0=now();
    for(int i=0;i<n;i++){snprintf(p,sizeof p,"%s/m%07d",dir,i);int fd=open(p,O_CREAT|O_WRONLY|O_TRUNC,0644);if(fd<0){perror(p);return 1;}
      if(wr&&write(fd,buf,wr)!=wr){perror("write");return 1;} close(fd);}
    double t1=now();
    const char*ctl=getenv("PERF_CTL");
    if(ctl){int c=open(ctl,O_WRONLY);if(c>=0){write(c,"enable\n",7);close(c);}}
    for(int i=0;i<n;i++){snprintf(p,sizeof p,"%s/m%07d",dir,i);if(unlink(p)){perror(p);return 1;}}
    double t2=now();
    if(ctl){int c=open(ctl,O_WRONLY);if(c>=0){write(c,"disable\n",8);close(c);}}
    printf("create %.3f us unlink %.3f us\n",(t1-t0)/n/1e3,(t2-t1)/n/1e3);
  }
  return 0;}
