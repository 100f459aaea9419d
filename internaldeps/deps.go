package deps
import (
 _ "go.etcd.io/raft/v3"
 _ "google.golang.org/grpc"
 _ "google.golang.org/protobuf/proto"
 _ "github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
 _ "github.com/BurntSushi/toml"
 _ "github.com/anishathalye/porcupine"
 _ "google.golang.org/genproto/googleapis/rpc/errdetails"
 _ "go.uber.org/goleak"
)
