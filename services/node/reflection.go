package node

import (
	"context"
	"net"
	"sync"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/reflection"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	errorsv1 "github.com/ursula/ursula/proto/gen/go/ursula/errors/v1"
)

// Service names of the gRPC reflection and health services, for the
// authorization checks of the planes.
var (
	reflectionV1Name      = reflectionv1.ServerReflection_ServiceDesc.ServiceName
	reflectionV1AlphaName = reflectionv1alpha.ServerReflection_ServiceDesc.ServiceName
)

// isReflection reports a service name of gRPC server reflection.
func isReflection(service string) bool {
	return service == reflectionV1Name || service == reflectionV1AlphaName
}

// registerReflection serves gRPC server reflection (v1 and v1alpha) on
// srv to the callers scope names (none: it registers nothing). It answers
// for the services registered on srv, the files they are defined in (with
// their imports) and the error model every plane shares (errorFiles),
// nothing else: not the other protocols linked into the binary (the
// cluster plane's Raft service, the admin service on the client plane),
// and no extensions. Register it after every other service of srv.
func registerReflection(srv *grpc.Server, scope reflectionScope) {
	if scope == reflectionNone {
		return
	}
	files := &planeFiles{srv: srv}
	opts := reflection.ServerOptions{Services: srv, DescriptorResolver: files, ExtensionResolver: &protoregistry.Types{}}
	v1, v1alpha := reflection.NewServerV1(opts), reflection.NewServer(opts)
	if scope == reflectionLoopbackCallers {
		v1, v1alpha = loopbackV1{v1}, loopbackV1Alpha{v1alpha}
	}
	reflectionv1.RegisterServerReflectionServer(srv, v1)
	reflectionv1alpha.RegisterServerReflectionServer(srv, v1alpha)
}

// loopbackCaller refuses a caller not connected over a loopback address
// as a server without reflection would (UNIMPLEMENTED).
func loopbackCaller(ctx context.Context) error {
	if p, ok := peer.FromContext(ctx); ok {
		if a, ok := p.Addr.(*net.TCPAddr); ok && a.IP.IsLoopback() {
			return nil
		}
	}
	return status.Error(codes.Unimplemented, "server reflection is served to loopback callers only (server.grpc_reflection)")
}

// loopbackV1 and loopbackV1Alpha serve reflection to loopback callers.
type (
	loopbackV1 struct {
		reflectionv1.ServerReflectionServer
	}
	loopbackV1Alpha struct {
		reflectionv1alpha.ServerReflectionServer
	}
)

func (l loopbackV1) ServerReflectionInfo(st reflectionv1.ServerReflection_ServerReflectionInfoServer) error {
	if err := loopbackCaller(st.Context()); err != nil {
		return err
	}
	return l.ServerReflectionServer.ServerReflectionInfo(st)
}

func (l loopbackV1Alpha) ServerReflectionInfo(st reflectionv1alpha.ServerReflection_ServerReflectionInfoServer) error {
	if err := loopbackCaller(st.Context()); err != nil {
		return err
	}
	return l.ServerReflectionServer.ServerReflectionInfo(st)
}

// planeFiles resolves the descriptors of one gRPC server's services: the
// files that define them and the files those import, built on first use
// (when every service is registered).
type planeFiles struct {
	srv   *grpc.Server
	once  sync.Once
	files *protoregistry.Files
}

func (p *planeFiles) get() *protoregistry.Files {
	p.once.Do(func() { p.files = serviceFiles(p.srv.GetServiceInfo()) })
	return p.files
}

// FindFileByPath implements protodesc.Resolver.
func (p *planeFiles) FindFileByPath(path string) (protoreflect.FileDescriptor, error) {
	return p.get().FindFileByPath(path)
}

// FindDescriptorByName implements protodesc.Resolver.
func (p *planeFiles) FindDescriptorByName(name protoreflect.FullName) (protoreflect.Descriptor, error) {
	return p.get().FindDescriptorByName(name)
}

// errorFiles define what a failed call carries: the google.rpc.ErrorInfo
// detail (a client such as grpcurl asks reflection for it to print the
// detail) and the contract's codes, whose names are its reasons.
var errorFiles = []protoreflect.FileDescriptor{
	errdetails.File_google_rpc_error_details_proto,
	errorsv1.File_ursula_errors_v1_errors_proto,
}

// serviceFiles collects the files defining services (looked up in the
// process's registry) and their imports, and errorFiles.
func serviceFiles(services map[string]grpc.ServiceInfo) *protoregistry.Files {
	files := &protoregistry.Files{}
	var add func(fd protoreflect.FileDescriptor)
	add = func(fd protoreflect.FileDescriptor) {
		if _, err := files.FindFileByPath(fd.Path()); err == nil {
			return
		}
		imports := fd.Imports()
		for i := range imports.Len() {
			add(imports.Get(i).FileDescriptor)
		}
		if err := files.RegisterFile(fd); err != nil {
			// Two files of the process's registry conflict: leave this one
			// out rather than answer for it wrongly.
			return
		}
	}
	for name := range services {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name))
		if err != nil {
			continue
		}
		add(d.ParentFile())
	}
	for _, fd := range errorFiles {
		add(fd)
	}
	return files
}
