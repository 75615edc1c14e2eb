import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
os.mkdir(d)
t = time.perf_counter()
for i in range(n):
    fd = os.open(f'{d}/f{i}', os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b'x' * 100)
    os.close(fd)
print(f'{(time.perf_counter() - t) / n * 1e6:.2f}')
