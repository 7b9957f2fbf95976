-- wrk script for bench/run.py's raw write rate: every request is a v2 PUT
-- with a form body, i.e. an etcd "set" of one small key (one raft entry each).
wrk.method = "PUT"
wrk.body = "value=x"
wrk.headers["Content-Type"] = "application/x-www-form-urlencoded"
